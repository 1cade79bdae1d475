"""What the why-report is built from (plain data), what one item of it is, and the links to evidence."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

PASS, FAIL, NOT_CHECKED, NOT_APPLICABLE = "pass", "fail", "not-checked", "not-applicable"
STATUSES = (PASS, FAIL, NOT_CHECKED, NOT_APPLICABLE)
# Rows of differences an item carries to show beside its line (the line names the first; the count says all).
MAX_DETAILS = 20


@dataclass
class RunFacts:
    """One compared run: its config, and what each of its ranks recorded about its stack and its NCCL log."""

    run_id: int
    job_id: int
    side: str  # "A" or "B"
    config_name: str
    config_hash: str
    config: dict[str, Any]  # the config body: env, torch, threads, ...
    workload: str
    world_size: int
    envs: list[dict[str, Any]] = field(default_factory=list)  # RankEnv rows as dicts, by rank
    logs: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> parsed NCCL/RCCL log

    @property
    def label(self) -> str:
        return f"{self.side} (run {self.run_id}, {self.config_name})"

    def device(self) -> str | None:
        return next((e.get("device") for e in self.envs if e.get("device")), None)


@dataclass
class AuditJob:
    """A finished op-audit or batch-invariance job: its stored result (/work contract) and its configs' hashes."""

    job_id: int
    kind: str
    config_hashes: list[str]  # by config index
    result: dict[str, Any]
    finished_at: str | None = None


@dataclass
class WhyInput:
    a: RunFacts
    b: RunFacts
    verdict: str | None
    first_divergent_step: int | None = None
    job_id: int | None = None  # the train job whose pair this is; None for any two runs
    op_audit: AuditJob | None = None
    batch_invariance: AuditJob | None = None
    # The comparison's first divergent component (detlab.core.components.summary); None: not known.
    first_component: dict[str, Any] | None = None


@dataclass
class Item:
    key: str
    title: str
    status: str
    found: str
    evidence: list[dict[str, str]] = field(default_factory=list)  # [{"text", "href"}], the first is the main one
    details: list[dict[str, Any]] = field(default_factory=list)  # [{"key", "where", "a", "b"}]
    differences: int = 0  # all differences found (details holds at most MAX_DETAILS)
    columns: list[str] = field(default_factory=lambda: ["A", "B"])  # what details' "a" and "b" hold
    source: dict[str, Any] | None = None  # an audit item's evidence: job, config, device

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "title": self.title, "status": self.status, "found": self.found,
                "evidence": self.evidence, "details": self.details[:MAX_DETAILS], "differences": self.differences,
                "columns": self.columns, "source": self.source}


# ---- links to evidence: pages and API views that exist ----------------------------------------------------

def link(text: str, href: str) -> dict[str, str]:
    return {"text": text, "href": href}


def job_page(job_id: int) -> str:
    return f"/jobs/{job_id}"


def comm_log(run_id: int, rank: int) -> str:
    return f"/api/v1/runs/{run_id}/commlog/{rank}"


def log_diff(run_a: int, run_b: int) -> str:
    return f"/api/v1/runs/{run_a}/logdiff/{run_b}"


def rank_envs(run_id: int) -> str:
    return f"/api/v1/runs/{run_id}/envs"


def submit_form(kind: str, workload: str) -> str:
    """The submit form, prefilled with a job kind and workload (frontend/static/index.js reads them)."""
    return "/?" + urlencode({"kind": kind, "workload": workload}, quote_via=quote)


def pair_page(data: WhyInput, anchor: str) -> str:
    """Where the pair's tables are: its train job's page, or the compare page of the two runs."""
    base = job_page(data.job_id) if data.job_id is not None else f"/compare?a={data.a.run_id}&b={data.b.run_id}"
    return f"{base}#{anchor}"


# ---- devices: is an audit's evidence from the runs' kind of device? ---------------------------------------

_GENERIC_GPU = re.compile(r"^(cuda|hip|rocm|gpu|mps|xpu)(:\d+)?$")


def device_class(device: str | None) -> str | None:
    """"cpu" for any CPU ("cpu (x86_64)"), "gpu" for a generic accelerator name ("cuda:0"), else the device's
    name lowered ("nvidia h200"); None when unknown."""
    if not device:
        return None
    name = device.strip().lower()
    if name.startswith("cpu"):
        return "cpu"
    return "gpu" if _GENERIC_GPU.match(name) else name


def same_device(a: str | None, b: str | None) -> bool:
    """Whether evidence measured on device `a` speaks for runs on device `b` (unknown counts as not)."""
    ca, cb = device_class(a), device_class(b)
    if ca is None or cb is None:
        return False
    if ca == cb:
        return True
    return "cpu" not in (ca, cb) and "gpu" in (ca, cb)


def shown(values: list[Any], limit: int = 4) -> str:
    out = ", ".join(str(v) for v in values[:limit])
    return out + (f" and {len(values) - limit} more" if len(values) > limit else "")
