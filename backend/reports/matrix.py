"""The findings matrix: config × stack over the history's measurements, filtered by workload/op/dtype
and date, aggregated in SQL (one GROUP BY into a few time buckets, so each cell has its trend); and a
cell's history, measurement by measurement, each linked to its job."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Float, and_, case, func, select, tuple_
from sqlalchemy.orm import Session

from detlab.backend.models import FindingCell, HistoryVersion
from detlab.backend.reports.findings import cost_of

TREND_BUCKETS = 6
HISTORY_LIMIT = 200


@dataclass(frozen=True)
class Scope:
    """What a matrix or a history covers; None = any."""

    kind: str | None = None
    workload: str | None = None
    op: str | None = None
    dtype: str | None = None
    since: datetime | None = None
    until: datetime | None = None  # exclusive

    def where(self) -> list[ColumnElement[bool]]:
        c = FindingCell
        out: list[ColumnElement[bool]] = []
        for column, value in ((c.kind, self.kind), (c.workload, self.workload), (c.op, self.op),
                              (c.dtype, self.dtype)):
            if value is not None:
                out.append(column == value)
        if self.since is not None:
            out.append(c.measured_at >= self.since)
        if self.until is not None:
            out.append(c.measured_at < self.until)
        return out


def _epoch(session: Session, column: Any) -> ColumnElement[float]:
    """Seconds since 1970 of a timestamp column, in this database's dialect."""
    if session.get_bind().dialect.name == "sqlite":
        return (func.julianday(column) - 2440587.5) * 86400.0
    return func.date_part("epoch", column, type_=Float)  # a double; extract() gives a slower numeric


def _aware(when: datetime) -> datetime:
    # SQLite gives timestamps back without their zone; they were written in UTC.
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _rate(identical: int, comparable: int) -> float | None:
    return identical / comparable if comparable else None


_options: dict[tuple[str, int | None], list[dict[str, str]]] = {}


def version(*, session: Session) -> tuple[str, int | None]:
    """What changes whenever the history does (findings.store counts history_version up): one lookup."""
    return str(session.get_bind().engine.url), session.scalar(select(HistoryVersion.version))


def options(*, session: Session, at: tuple[str, int | None]) -> list[dict[str, str]]:
    """The (kind, workload, op, dtype) combinations measured, for the page's filter: train first.

    A scan of the whole history, so kept per database until the history changes (`at`: its version())."""
    c = FindingCell
    if at not in _options:
        rows = session.execute(select(c.kind, c.workload, c.op, c.dtype).distinct()
                               .order_by(c.kind.desc(), c.workload, c.op, c.dtype)).all()
        if len(_options) > 16:
            _options.clear()
        _options[at] = [{"kind": k, "workload": w, "op": o, "dtype": d} for k, w, o, d in rows]
    return _options[at]


def default_scope(*, session: Session, scope: Scope, at: tuple[str, int | None]) -> Scope:
    """The scope itself, or, when it names no kind, that of the first thing measured: a matrix is of one
    kind of measurement (repeats of a train workload, or sizes of a collective op and dtype), never a mix."""
    if scope.kind is not None:
        return scope
    first = next(iter(options(session=session, at=at)), None)
    if first is None:
        return scope
    return Scope(kind=first["kind"], workload=first["workload"],
                 op=first["op"] if first["kind"] != "train" else None,
                 dtype=first["dtype"] if first["kind"] != "train" else None, since=scope.since, until=scope.until)


# What a cell with nothing comparable lacks, and how to measure it.
LACKS = {"train": "reproducibility not measured: run the job with repeats >= 2",
         "": "not measured: no repeat or size was compared"}


def matrix(*, session: Session, scope: Scope) -> dict[str, Any]:
    """Config × stack: per cell, repeats (train) or sizes (collective) identical of those comparable, the
    latest cost with its interval, the earliest first divergence, the latest busbw, its measurements and
    latest job, and the rate in each of TREND_BUCKETS equal slices of the time covered (the trend)."""
    c = FindingCell
    where = scope.where()
    lo, hi = session.execute(select(func.min(c.measured_at), func.max(c.measured_at)).where(*where)).one()
    if lo is None:
        return {"configs": [], "stacks": [], "cells": [], "buckets": []}
    start, end = scope.since or _aware(lo), scope.until or (_aware(hi) + timedelta(seconds=1))
    t0 = start.timestamp()
    width = max((end - start).total_seconds() / TREND_BUCKETS, 1.0)
    bucket = func.floor((_epoch(session, c.measured_at) - t0) / width)
    costed = func.max(case((c.cost.is_not(None), c.measured_at)))  # the latest measurement with a cost
    rows = session.execute(select(
        c.config, c.stack, bucket.label("bucket"), func.sum(c.identical), func.sum(c.comparable), func.count(),
        func.min(c.first_divergent_step), func.max(c.measured_at), func.max(c.job_id), func.max(c.busbw_gbps),
        costed).where(*where).group_by(c.config, c.stack, bucket)).all()
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    slots: dict[tuple[str, str], list[list[int]]] = {}
    latest_cost: dict[tuple[str, str], datetime] = {}
    for config, stack, b, identical, comparable, count, first, last, job_id, busbw, cost_at in rows:
        key = (config, stack)
        cell = cells.get(key)
        if cell is None:
            cell = cells[key] = {"config": config, "stack": stack, "identical": 0, "comparable": 0, "measurements": 0,
                                 "first_divergent_step": first, "last_measured_at": last, "latest_job_id": job_id,
                                 "busbw_gbps": busbw}
            slots[key] = [[0, 0] for _ in range(TREND_BUCKETS)]
        cell["identical"] += int(identical)
        cell["comparable"] += int(comparable)
        cell["measurements"] += int(count)
        cell["first_divergent_step"] = _least(cell["first_divergent_step"], first)
        cell["last_measured_at"] = max(cell["last_measured_at"], last)
        cell["latest_job_id"] = _most(cell["latest_job_id"], job_id)
        cell["busbw_gbps"] = _most(cell["busbw_gbps"], busbw)
        if cost_at is not None and (key not in latest_cost or cost_at > latest_cost[key]):
            latest_cost[key] = cost_at
        slot = slots[key][min(max(int(b), 0), TREND_BUCKETS - 1)]
        slot[0] += int(identical)
        slot[1] += int(comparable)
    costs = _latest_costs(session=session, where=where, latest=latest_cost)
    for key, cell in cells.items():
        cell["rate"] = _rate(cell["identical"], cell["comparable"])
        cell["lacks"] = None if cell["comparable"] else LACKS.get(scope.kind or "", LACKS[""])
        cell["trend"] = [_rate(k, n) for k, n in slots[key]]
        cell["last_measured_at"] = _aware(cell["last_measured_at"]).isoformat()
        cell.update(costs.get(key) or cost_of(None, None, None))
    ordered = sorted(cells.values(), key=lambda x: (x["config"], x["stack"]))
    return {"configs": sorted({k[0] for k in cells}), "stacks": sorted({k[1] for k in cells}), "cells": ordered,
            "buckets": [{"start": (start + timedelta(seconds=i * width)).isoformat(),
                         "end": (start + timedelta(seconds=(i + 1) * width)).isoformat()}
                        for i in range(TREND_BUCKETS)]}


def _least(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else min(a, b)


def _most(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)


def _latest_costs(*, session: Session, where: list[ColumnElement[bool]],
                  latest: dict[tuple[str, str], datetime]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (config, stack): the cost of its latest measurement that has one (`latest` says when: a cost is
    relative to its job's config 0, so costs from different jobs are not pooled). Looked up by the
    history index, one (config, stack, time) each."""
    if not latest:
        return {}
    c = FindingCell
    rows = session.execute(select(c.config, c.stack, c.measured_at, c.id, c.cost, c.cost_lo, c.cost_hi).where(
        *where, c.cost.is_not(None),
        tuple_(c.config, c.stack, c.measured_at).in_([(*k, when) for k, when in latest.items()]))
        .order_by(c.id)).all()
    return {(config, stack): cost_of(cost, lo, hi) for config, stack, _, _, cost, lo, hi in rows}


def history(*, session: Session, scope: Scope, config: str, stack: str) -> list[dict[str, Any]]:
    """One matrix cell's measurements, newest first (at most HISTORY_LIMIT), each with its job."""
    c = FindingCell
    rows = session.scalars(select(c).where(and_(*scope.where(), c.config == config, c.stack == stack))
                           .order_by(c.measured_at.desc(), c.id.desc()).limit(HISTORY_LIMIT))
    return [{"source": r.source, "job_id": r.job_id, "job_url": r.job_id and f"/jobs/{r.job_id}",
             "measured_at": _aware(r.measured_at).isoformat(), "kind": r.kind, "workload": r.workload, "op": r.op,
             "dtype": r.dtype, "identical": r.identical, "comparable": r.comparable,
             "rate": _rate(r.identical, r.comparable), "runs": r.runs,
             "first_divergent_step": r.first_divergent_step, "largest_bytes": r.largest_bytes,
             "busbw_gbps": r.busbw_gbps, "config_env": r.config_env, "driver": r.driver, "runtime": r.runtime,
             "torch": r.torch, "library": r.library, "hardware": r.hardware,
             **cost_of(r.cost, r.cost_lo, r.cost_hi)} for r in rows]
