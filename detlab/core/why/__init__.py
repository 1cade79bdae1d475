"""The why-report: for two runs that should be bit-identical, a checklist in the order engineers debug a
divergence (the team's notes: logs → env parity → atomics → topology, then batch invariance), each item
pass / fail / not checked / not applicable, one line of what was found, and links to its evidence.

Pure functions over plain data (RunFacts, AuditJob); the server loads them (backend/services/why.py)."""

from __future__ import annotations

from typing import Any

from .audits import batch_invariance_item, op_audit_item
from .data import data_order_item
from .facts import NOT_APPLICABLE, NOT_CHECKED, STATUSES, AuditJob, Item, RunFacts, WhyInput
from .runs import comm_log_item, env_parity_item, stack_item

__all__ = ["NOT_APPLICABLE", "NOT_CHECKED", "STATUSES", "AuditJob", "Item", "RunFacts", "WhyInput", "build",
           "note_for"]


def note_for(verdict: str | None) -> str | None:
    """What the checklist means for a pair that did not diverge: it explains divergences, so there it only shows
    what was recorded."""
    if verdict == "diverged":
        return None
    said = f"this pair is {verdict}" if verdict else "this pair has no verdict yet"
    return f"The checklist explains diverged comparisons; {said}, so it only shows what was recorded."


def build(data: WhyInput) -> dict[str, Any]:
    """The checklist for runs A and B, in the debug order: logs, env parity, nondeterministic ops, stack and
    topology, batch invariance of the model; then the data the runs read."""
    items = [comm_log_item(data), env_parity_item(data), op_audit_item(data), stack_item(data),
             batch_invariance_item(data), data_order_item(data)]
    return {"run_a": data.a.run_id, "run_b": data.b.run_id, "job_id": data.job_id, "verdict": data.verdict,
            "first_divergent_step": data.first_divergent_step, "note": note_for(data.verdict),
            "items": [{"step": i + 1, **item.as_dict()} for i, item in enumerate(items)]}
