"""The items read from other jobs of the same workload (the diagnosis contract's result shapes): the latest
finished op-audit (step 3, nondeterministic ops such as atomics) and batch-invariance job (step 5)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .facts import FAIL, NOT_CHECKED, PASS, AuditJob, Item, WhyInput, job_page, link, same_device, shown, submit_form

OPS_TITLE = "Nondeterministic ops: atomics and other ops outside the collectives"
BATCH_TITLE = "Batch invariance of the model: a sample's output bits do not depend on the batch size"
AUDIT_COLUMNS = ["finding", "evidence"]


# The workload of SDK recordings (detlab.sdk.store.WORKLOAD): the user's own loop, which no job can run.
SDK_WORKLOAD = "sdk"


def _new_job(kind: str, workload: str) -> list[dict[str, str]]:
    """The submit form prefilled for a new job of the workload; none for an SDK recording (the form does not
    know `sdk` and would show another workload in its place)."""
    return [] if workload == SDK_WORKLOAD else [link(f"new {kind} job of {workload}", submit_form(kind, workload))]


def _not_run(data: WhyInput, key: str, title: str, kind: str) -> Item:
    workload = data.a.workload
    if workload == SDK_WORKLOAD:
        return Item(key, title, NOT_CHECKED, f"not checked: run {data.a.run_id} (A) is an SDK recording: its model is "
                    f"your script's, and a {kind} job runs detlab's registered workloads only", [],
                    columns=AUDIT_COLUMNS)
    return Item(key, title, NOT_CHECKED, f"not checked: no finished {kind} job of workload {workload}",
                _new_job(kind, workload), columns=AUDIT_COLUMNS)


def _config_hash(audit: AuditJob, config: dict[str, Any]) -> str | None:
    index = config.get("index")
    return audit.config_hashes[index] if isinstance(index, int) and 0 <= index < len(audit.config_hashes) else None


def _evidence_configs(audit: AuditJob, data: WhyInput, has: Callable[[dict[str, Any]], bool]
                      ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
    """The audit's configs that carry evidence: those of the compared runs' configs where it ran them, else all;
    and of those, the ones measured on the runs' kind of device; and whether they are the runs' configs."""
    configs = [c for c in audit.result.get("configs") or [] if isinstance(c, dict) and has(c)]
    hashes = {data.a.config_hash, data.b.config_hash}
    matching = [c for c in configs if _config_hash(audit, c) in hashes]
    chosen = matching or configs
    devices = {d for d in (data.a.device(), data.b.device()) if d}
    on_device = [c for c in chosen if any(same_device(c.get("device"), d) for d in devices)]
    return chosen, on_device, bool(matching)


def _where(config: dict[str, Any]) -> str:
    return f"config {config.get('label') or config.get('index')} on {config.get('device') or 'unknown device'}"


def _source(audit: AuditJob, configs: list[dict[str, Any]], same_config: bool) -> dict[str, Any]:
    return {"job_id": audit.job_id, "kind": audit.kind, "finished_at": audit.finished_at,
            "configs": [c.get("label") for c in configs], "devices": sorted({str(c.get("device")) for c in configs}),
            "same_config": same_config}


def _from(audit: AuditJob, configs: list[dict[str, Any]], same_config: bool) -> str:
    whose = "" if same_config else ", not the compared runs' configs"
    return f"job #{audit.job_id}, {shown([_where(c) for c in configs], 2)}{whose}"


def _elsewhere(data: WhyInput, key: str, title: str, audit: AuditJob, chosen: list[dict[str, Any]]) -> Item:
    devices = sorted({str(d) for d in (data.a.device(), data.b.device()) if d}) or ["an unknown device"]
    ran = sorted({str(c.get("device")) for c in chosen}) or ["nothing for this workload"]
    return Item(key, title, NOT_CHECKED, f"not checked on the runs' device: the latest {audit.kind} (job "
                f"#{audit.job_id}) measured {shown(ran)}; the runs ran on {shown(devices)}",
                [link(f"{audit.kind} job #{audit.job_id}", job_page(audit.job_id)),
                 *_new_job(audit.kind, data.a.workload)],
                columns=AUDIT_COLUMNS, source=_source(audit, chosen, False))


def op_audit_item(data: WhyInput) -> Item:
    """Step 3: ops of the workload that PyTorch flags as nondeterministic on this device, or that gave other bits
    on a re-run (also where the config claims determinism: `ineffective`)."""
    key, audit = "ops", data.op_audit
    if audit is None:
        return _not_run(data, key, OPS_TITLE, "op-audit")
    chosen, configs, same = _evidence_configs(audit, data, lambda c: isinstance(c.get("ops"), list))
    if not configs:
        return _elsewhere(data, key, OPS_TITLE, audit, chosen)
    evidence = [link(f"op-audit job #{audit.job_id}", job_page(audit.job_id))]
    source = _source(audit, configs, same)
    rows = [{"key": op.get("op"), "where": _where(c), "a": "nondeterministic", "b": op.get("evidence") or ""}
            for c in configs for op in c["ops"] if op.get("nondeterministic") is True]
    rows += [{"key": name, "where": _where(c), "a": "gave other bits although the config claims determinism",
              "b": "re-run"} for c in configs for name in c.get("ineffective") or []]
    ops = [op for c in configs for op in c["ops"]]
    unchecked = sorted({str(op.get("op")) for op in ops if op.get("nondeterministic") is None})
    if rows:
        names = list(dict.fromkeys(str(r["key"]) for r in rows))
        first = rows[0]
        return Item(key, OPS_TITLE, FAIL, f"{shown(names)} nondeterministic ({first['b'] or first['a']}); "
                    f"{_from(audit, configs, same)}", evidence, rows, len(rows), AUDIT_COLUMNS, source)
    checked = len(ops) - sum(op.get("nondeterministic") is None for op in ops)
    if not checked:
        return Item(key, OPS_TITLE, NOT_CHECKED, f"job #{audit.job_id} could not check any op of the workload",
                    evidence, columns=AUDIT_COLUMNS, source=source)
    rest = f"; {len(unchecked)} could not be checked: {shown(unchecked)}" if unchecked else ""
    return Item(key, OPS_TITLE, PASS, f"none of {checked} op call(s) checked is nondeterministic{rest} "
                f"({_from(audit, configs, same)})", evidence, columns=AUDIT_COLUMNS, source=source)


def batch_invariance_item(data: WhyInput) -> Item:
    """Step 5: the workload's model gives a sample the same bits at every batch size measured (split-k and
    friends break that: runs that split the global batch over other world sizes then part)."""
    key, audit, workload = "batch", data.batch_invariance, data.a.workload
    if audit is None:
        return _not_run(data, key, BATCH_TITLE, "batch-invariance")
    chosen, configs, same = _evidence_configs(
        audit, data, lambda c: isinstance(c.get("model"), dict) and c["model"].get("workload") == workload)
    if not configs:
        return _elsewhere(data, key, BATCH_TITLE, audit, chosen)
    evidence = [link(f"batch-invariance job #{audit.job_id}", job_page(audit.job_id))]
    source = _source(audit, configs, same)
    split = f"; the compared runs split the batch over {data.a.world_size} vs {data.b.world_size} ranks" \
        if data.a.world_size != data.b.world_size else ""
    broken = [c for c in configs if c["model"].get("invariant") is False]
    rows = [{"key": c["model"].get("first_module") or "the model", "where": _where(c),
             "a": f"first breaks at batch size {c['model'].get('first_break')}",
             "b": f"batch sizes {shown(c['model'].get('batch_sizes') or [], 8)}"} for c in broken]
    if broken:
        model = broken[0]["model"]
        at = f" in {model['first_module']}" if model.get("first_module") else ""
        return Item(key, BATCH_TITLE, FAIL, f"the model's output changes with the batch size: first at batch size "
                    f"{model.get('first_break')}{at} ({_from(audit, broken, same)}){split}", evidence, rows,
                    len(rows), AUDIT_COLUMNS, source)
    if all(c["model"].get("invariant") is True for c in configs):
        sizes = sorted({s for c in configs for s in c["model"].get("batch_sizes") or []})
        return Item(key, BATCH_TITLE, PASS, f"the same bits at batch sizes {shown(sizes, 8)} "
                    f"({_from(audit, configs, same)}){split}", evidence, columns=AUDIT_COLUMNS, source=source)
    return Item(key, BATCH_TITLE, NOT_CHECKED, f"job #{audit.job_id} did not decide the model's invariance",
                evidence, columns=AUDIT_COLUMNS, source=source)
