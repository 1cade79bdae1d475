"""The team-wide history: every finished job (train, collective, sweep) and every imported result file,
as measurements of a config on a workload on a stack (GPU, driver, CUDA/ROCm, torch, NCCL/RCCL).

Writing keeps two tables: `findings` (a collective's cells, one per message size) and `finding_cells`
(one measurement per source × config × op × dtype, sizes folded), which the pages read, aggregated
in SQL (see detlab.backend.reports.matrix)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from detlab.backend.kinds.registry import KINDS
from detlab.backend.models import Finding, FindingCell, HistoryVersion, Job, RankEnv, Run
from detlab.backend.schemas import JobRead
from detlab.core.compare import cost_text

TRAIN_KEYS = ("verdict", "throughput", "reproducibility")  # a train comparison, stored or exported


class NotAResult(ValueError):
    """A file or dict that holds no detlab job result."""


# ---- the stack a measurement ran on --------------------------------------------------------------


def library_of(facts: dict[str, Any]) -> str:
    """'NCCL 2.28.9', 'RCCL 2.22.3', 'gloo', or 'unknown'."""
    if facts.get("library"):
        return str(facts["library"])
    if facts.get("nccl") and facts.get("backend") in (None, "nccl"):
        return f"{'RCCL' if facts.get('hip') else 'NCCL'} {facts['nccl']}"
    return str(facts.get("backend") or "unknown")


def stack_of(facts: dict[str, Any], world_size: int) -> dict[str, Any]:
    """The stack columns of a measurement from one rank's facts (device, driver, cuda, hip, torch, nccl,
    backend; or `library` as read from a log), and its label: the key a matrix groups by."""
    device = facts.get("device") or "unknown device"
    runtime = f"CUDA {facts['cuda']}" if facts.get("cuda") else f"ROCm {facts['hip']}" if facts.get("hip") else None
    stack = {"hardware": f"{world_size} x {device}"[:128], "world_size": world_size,
             "driver": (facts.get("driver") or None), "runtime": runtime, "torch": facts.get("torch") or None,
             "library": library_of(facts)[:64]}
    parts = [stack["hardware"], stack["driver"] and f"driver {stack['driver']}", runtime,
             stack["torch"] and f"torch {stack['torch']}", stack["library"]]
    stack["stack"] = " · ".join(str(p) for p in parts if p)[:255]
    return stack


def _when(value: Any) -> datetime:
    if isinstance(value, datetime):
        when = value
    else:
        when = datetime.fromisoformat(str(value))
    return when if when.tzinfo else when.replace(tzinfo=UTC)


# ---- rows and cells from a result ---------------------------------------------------------------


def rows_from_result(source: str, job: dict[str, Any], result: dict[str, Any]) -> list[dict[str, Any]]:
    """Finding rows from a collective/sweep job (as GET /jobs/N) and its result (as GET /jobs/N/collective)."""
    device = next((r["device"] for r in job["runs"] if r.get("device")), None) or "unknown device"
    libraries = sorted({f"{log['library']} {log['version']}" for log in result.get("logs", [])
                        if log.get("library") and log.get("version")})
    configs = {c["index"]: c for c in result["configs"]}
    return [{"source": source, "hardware": f"{job['world_size']} x {device}"[:128],
             "library": ", ".join(libraries)[:64] or "gloo", "world_size": job["world_size"],
             "config": configs[c["config_index"]]["name"], "config_env": configs[c["config_index"]]["env"],
             "op": c["op"], "dtype": c["dtype"], "bytes": c["bytes"], "runs": c["runs"],
             "reproducible": bool(c["reproducible"]), "busbw_gbps": c["busbw_gbps"]}
            for c in result["cells"]]


def collective_cells(source: str, job: dict[str, Any], rows: list[dict[str, Any]], facts: dict[str, Any],
                     *, job_id: int | None = None) -> list[dict[str, Any]]:
    """One measurement per config × op × dtype of a collective/sweep job, its sizes folded: sizes
    reproducible of sizes measured, and the bus bandwidth at the largest size."""
    index = {c["name"]: i for i, c in enumerate(job["configs"])}
    for r in rows:  # rows without their job's configs: numbered in order of appearance
        index.setdefault(r["config"], len(index))
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["config"], r["op"], r["dtype"]), []).append(r)
    out = []
    for (config, op, dtype), cells in groups.items():
        largest = max(c["bytes"] for c in cells)
        at_largest = [c["busbw_gbps"] for c in cells if c["bytes"] == largest and c["busbw_gbps"] is not None]
        stack = stack_of({**facts, "library": cells[0]["library"]}, job["world_size"])
        out.append({"source": source, "job_id": job_id, "measured_at": _when(job["created_at"]),
                    "kind": "collective", "workload": "collective", "op": op, "dtype": dtype,
                    "config_index": index[config], "config": config, "config_env": cells[0]["config_env"],
                    **stack, "identical": sum(c["reproducible"] for c in cells), "comparable": len(cells),
                    "runs": min(c["runs"] for c in cells), "cost": None, "cost_lo": None, "cost_hi": None,
                    "first_divergent_step": None, "largest_bytes": largest,
                    "busbw_gbps": max(at_largest) if at_largest else None})
    return out


def _comparable(repro: dict[str, Any], throughput: dict[str, Any]) -> int:
    """Repeats compared with the first (identical or diverged). Results stored before `comparable` was
    kept give it through the rate, or the runs that recorded."""
    if "comparable" in repro:
        return int(repro["comparable"])
    if repro.get("rate"):
        return round(repro["identical_to_first"] / repro["rate"])
    recorded = repro.get("recorded", throughput.get("runs", repro.get("repeats", 0)))
    return max(int(recorded) - 1, 0) if repro.get("rate") is not None else 0


def train_cells(source: str, job: dict[str, Any], result: dict[str, Any], facts: dict[int, dict[str, Any]],
                *, job_id: int | None = None, measured_at: Any = None) -> list[dict[str, Any]]:
    """One measurement per config of a train job: repeats identical to the first of the comparable
    ones, the cost against config 0 with its bootstrap interval, where repeats first parted."""
    configs = job["configs"]
    throughput = {t["config_index"]: t for t in result.get("throughput") or []}
    out = []
    for repro in result.get("reproducibility") or []:
        i = int(repro["config_index"])
        thr = throughput.get(i, {})
        interval = thr.get("cost_interval") or [None, None]
        world_size = int(thr.get("world_size") or (configs[i]["body"].get("world_size") if i < len(configs) else 0)
                         or job["world_size"])
        out.append({"source": source, "job_id": job_id, "measured_at": _when(measured_at or job["created_at"]),
                    "kind": "train", "workload": job["workload"], "op": "", "dtype": "", "config_index": i,
                    "config": str(repro.get("name") or configs[i]["name"])[:64],
                    "config_env": configs[i]["body"].get("env", {}) if i < len(configs) else {},
                    **stack_of(facts.get(i) or facts.get(0) or {}, world_size),
                    "identical": int(repro.get("identical_to_first") or 0), "comparable": _comparable(repro, thr),
                    "runs": int(repro.get("repeats") or 0), "cost": thr.get("cost"),
                    "cost_lo": interval[0], "cost_hi": interval[1],
                    "first_divergent_step": repro.get("first_divergent_step"),
                    "largest_bytes": None, "busbw_gbps": None})
    if out and not any(c["comparable"] for c in out) and result.get("verdict") in ("identical", "diverged"):
        out.append(_pair_cell(out[0], out[1]["config"] if len(out) > 1 else str(configs[1]["name"]), result))
    return out


def _pair_cell(a: dict[str, Any], b_name: str, result: dict[str, Any]) -> dict[str, Any]:
    """A single-repeat job measured no config against itself, but config 0 against config 1: that A-vs-B result
    is a measurement of its own, the cell `A vs B` (identical 1 of 1, or 0 of 1 and where they parted;
    config_index -1: a pair, not one config)."""
    return {**a, "config_index": -1, "config": f"{a['config']} vs {b_name}"[:64], "config_env": {},
            "identical": int(result["verdict"] == "identical"), "comparable": 1, "runs": 2, "cost": None,
            "cost_lo": None, "cost_hi": None, "first_divergent_step": result.get("first_divergent_step")}


def _op_column(op: str) -> str:
    """An op name as the 32-character column holds it: long aten names keep their head and a hash of the whole."""
    return op if len(op) <= 32 else f"{op[:23]}~{hashlib.sha1(op.encode()).hexdigest()[:8]}"


def diagnosis_cells(source: str, job: dict[str, Any], result: dict[str, Any], facts: dict[int, dict[str, Any]],
                    *, job_id: int | None = None, measured_at: Any = None) -> list[dict[str, Any]]:
    """A diagnosis job's measurements, keyed like the others (config × op × stack): batch-invariance, one per
    config × op × dtype, batch sizes invariant of batch sizes measured (and the workload's forward, op
    "model"); op-audit, one per config × op checked, 1 of 1 when it gave the same bits and no alert."""
    configs = job["configs"]
    out = []
    for c in result["configs"]:
        i = int(c["index"])
        base = {"source": source, "job_id": job_id, "measured_at": _when(measured_at or job["created_at"]),
                "kind": result["kind"], "workload": job["workload"], "config_index": i, "config": c["label"][:64],
                "config_env": configs[i]["body"].get("env", {}) if i < len(configs) else {},
                **stack_of(facts.get(i) or {}, 1), "cost": None, "cost_lo": None, "cost_hi": None,
                "first_divergent_step": None, "largest_bytes": None, "busbw_gbps": None}
        if result["kind"] == "batch-invariance":
            groups: dict[tuple[str, str], list[bool]] = {}
            for r in c["results"]:
                groups.setdefault((r["op"], r["dtype"]), []).append(r["invariant"])
            if c.get("model"):
                groups[("model", "")] = [c["model"]["invariant"]]  # the forward, at its batch sizes
            out += [{**base, "op": op, "dtype": dtype, "identical": sum(flags), "comparable": len(flags), "runs": 1}
                    for (op, dtype), flags in groups.items()]
        else:
            out += [{**base, "op": _op_column(o["op"]), "dtype": "", "identical": int(not o["nondeterministic"]),
                     "comparable": 1, "runs": 1} for o in c["ops"] if o["nondeterministic"] is not None]
    return out


def _file_facts(job: dict[str, Any], result: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Stack facts an exported file holds: a train comparison's environment (A, B), else the runs' device."""
    device = next((r["device"] for r in job.get("runs", []) if r.get("device")), None)
    facts: dict[int, dict[str, Any]] = {0: {"device": device}, 1: {"device": device}}
    for fact in result.get("environment") or []:
        facts[0][fact["key"]] = fact.get("a")
        facts[1][fact["key"]] = fact.get("b")
    return facts


def _is_diagnosis(result: dict[str, Any]) -> bool:
    """A diagnosis result names its kind (reports.diagnosis); the kind says which report it is."""
    kind = KINDS.get(str(result.get("kind")))
    return kind is not None and kind.report_name == "diagnosis"


def from_file(source: str, data: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(findings rows, cells) of a result file of any kind in results/: {job, result} of a collective or
    sweep job, {job, result} of a train job, or a train comparison with its job beside it ({job, verdict, …}).
    Raises NotAResult (or KeyError/TypeError/ValueError on a malformed one) for anything else."""
    if not isinstance(data, dict) or not isinstance(data.get("job"), dict):
        raise NotAResult("no 'job' object")
    job = data["job"]
    result: dict[str, Any] = data["result"] if isinstance(data.get("result"), dict) else data
    if _is_diagnosis(result) and "configs" in result:
        return [], diagnosis_cells(source, job, result, _file_facts(job, result))
    if "cells" in result and "configs" in result:
        rows = rows_from_result(source, job, result)
        return rows, collective_cells(source, job, rows, _file_facts(job, result)[0])
    if all(k in result for k in TRAIN_KEYS):
        return [], train_cells(source, job, result, _file_facts(job, result))
    raise NotAResult("neither a collective result (cells, configs) nor a train comparison "
                     "(verdict, throughput, reproducibility)")


# ---- storing -----------------------------------------------------------------------------------


def store(*, session: Session, rows: list[dict[str, Any]], cells: list[dict[str, Any]] | None = None,
          sources: set[str] | None = None) -> int:
    """Replace the findings of each source in `rows`/`cells` (and in `sources`: a re-imported file or a
    re-settled job). Cells default to those folded from `rows`. Returns the findings rows stored."""
    if cells is None:
        cells = []
        by_source: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            by_source.setdefault(r["source"], []).append(r)
        for source, part in by_source.items():
            job = {"configs": [], "world_size": part[0]["world_size"], "created_at": datetime.now(UTC)}
            cells += collective_cells(source, job, part, {"device": part[0]["hardware"].split(" x ", 1)[-1]})
    for source in {r["source"] for r in rows} | {c["source"] for c in cells} | (sources or set()):
        session.execute(delete(Finding).where(Finding.source == source))
        session.execute(delete(FindingCell).where(FindingCell.source == source))
    session.add_all(Finding(**r) for r in rows)
    session.add_all(FindingCell(**c) for c in cells)
    session.flush()
    _count_version(session)
    return len(rows)


def _count_version(session: Session) -> None:
    """history_version's row counted up (created the first time): what the matrix's readers check."""
    dialect = session.get_bind().dialect.name
    insert = sqlite_insert if dialect == "sqlite" else postgresql_insert
    session.execute(insert(HistoryVersion).values(id=1, version=1).on_conflict_do_update(
        index_elements=[HistoryVersion.id], set_={"version": HistoryVersion.version + 1}))


def job_facts(*, session: Session, job: Job) -> dict[int, dict[str, Any]]:
    """Per config index: the stack facts of its first run's lowest rank that recorded them."""
    facts: dict[int, dict[str, Any]] = {}
    envs = session.execute(select(Run.config_index, RankEnv).join(RankEnv, RankEnv.run_id == Run.id)
                           .where(Run.job_id == job.id).order_by(Run.config_index, Run.repeat, RankEnv.rank))
    for index, env in envs:
        facts.setdefault(index, {k: getattr(env, k) for k in ("device", "driver", "cuda", "hip", "torch", "nccl",
                                                              "backend")})
    for run in job.runs:  # runs that recorded no environment still name their device
        facts.setdefault(run.config_index, {"device": run.device})
        if not facts[run.config_index].get("device"):
            facts[run.config_index]["device"] = run.device
    return facts


def record_job(*, session: Session, job: Job, result: dict[str, Any]) -> None:
    """Keep a finished job's measurements in the history: a collective/sweep job's cells (its result, as
    GET /jobs/N/collective) or a train job's configs (its result, as GET /jobs/N/comparison)."""
    source = f"job {job.id}"
    data = JobRead.model_validate(job).model_dump()
    facts = job_facts(session=session, job=job)
    measured_at = job.finished_at or job.created_at
    if KINDS[job.kind].report_name == "fix":
        # A search's trials are not matrix cells: its prescription is read from the job (reports.prescriptions).
        # Counting the history up is what makes the findings' readers see it.
        store(session=session, rows=[], cells=[], sources={source})
    elif _is_diagnosis(result):
        store(session=session, rows=[], cells=diagnosis_cells(source, data, result, facts, job_id=job.id,
                                                              measured_at=measured_at), sources={source})
    elif "cells" in result:
        rows = rows_from_result(source, data, result)
        cells = collective_cells(source, data, rows, facts.get(0, {}), job_id=job.id)
        for cell in cells:
            cell["measured_at"] = _when(measured_at)
        store(session=session, rows=rows, cells=cells, sources={source})
    else:
        store(session=session, rows=[], cells=train_cells(source, data, result, facts, job_id=job.id,
                                                          measured_at=measured_at), sources={source})


# ---- reading -----------------------------------------------------------------------------------


def cost_of(cost: float | None, lo: float | None, hi: float | None) -> dict[str, Any]:
    """A stored cost as the pages show it, worded as everywhere else ('within noise' when it spans 0)."""
    if cost is None:
        return {"cost": None, "cost_interval": None, "within_noise": None, "cost_text": "not measured"}
    interval = [lo, hi] if lo is not None and hi is not None else None
    within = interval is not None and lo <= 0.0 <= hi  # type: ignore[operator]
    text = cost_text({"cost": cost, "interval": interval, "within_noise": within if interval else None})
    return {"cost": cost, "cost_interval": interval, "within_noise": within if interval else None, "cost_text": text}
