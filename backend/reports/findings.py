"""The team-wide history: configs vs reproducibility and bandwidth, across hardware and libraries."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from detlab.backend.models import Finding, Job
from detlab.backend.schemas import JobRead


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


def store(*, session: Session, rows: list[dict[str, Any]]) -> int:
    """Replace the findings of each source in `rows` (a re-imported file or a re-settled job)."""
    for source in {r["source"] for r in rows}:
        session.execute(delete(Finding).where(Finding.source == source))
    session.add_all(Finding(**r) for r in rows)
    session.flush()
    return len(rows)


def record_job(*, session: Session, job: Job, result: dict[str, Any]) -> None:
    """Keep a finished collective/sweep job's cells (its result, as GET /jobs/N/collective) in the history."""
    store(session=session, rows=rows_from_result(f"job {job.id}", JobRead.model_validate(job).model_dump(), result))


def summary(*, session: Session) -> list[dict[str, Any]]:
    """Per (hardware, library, config, op, dtype): sizes reproducible and busbw at the largest size."""
    groups: dict[tuple[str, ...], list[Finding]] = {}
    for f in session.scalars(select(Finding).order_by(Finding.bytes)):
        groups.setdefault((f.hardware, f.library, f.config, f.op, f.dtype), []).append(f)
    out = []
    for (hardware, library, config, op, dtype), cells in sorted(groups.items()):
        largest = max(c.bytes for c in cells)
        at_largest = [c.busbw_gbps for c in cells if c.bytes == largest and c.busbw_gbps is not None]
        out.append({"hardware": hardware, "library": library, "config": config, "op": op, "dtype": dtype,
                    "env": cells[-1].config_env, "sources": sorted({c.source for c in cells}),
                    "sizes": len({c.bytes for c in cells}), "reproducible": sum(c.reproducible for c in cells),
                    "cells": len(cells), "min_runs": min(c.runs for c in cells), "largest_bytes": largest,
                    "busbw_gbps_at_largest": max(at_largest) if at_largest else None})
    return out
