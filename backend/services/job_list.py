"""The jobs list: filters, search, a whitelisted sort and a page, in three queries whatever the page size
(the count, the page's rows, their configs); never the jobs' results, which can be megabytes each."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, func, or_, select
from sqlalchemy.orm import Session

from detlab.backend.models import Config, Job, JobTag, Run
from detlab.backend.schemas import JobsQuery

# Every sort breaks ties on the id, in the same direction, so that pages neither repeat nor skip a job.
# Ids are given in creation order, so "created" is the id's: a filter's matches (a tag's, from its
# index) then come in page order without sorting them all first.
SORT_COLUMNS: dict[str, Any] = {"created": Job.id, "id": Job.id, "status": Job.status,
                                "verdict": Job.verdict, "workload": Job.workload, "kind": Job.kind}
_LISTED = (Job.id, Job.kind, Job.workload, Job.status, Job.created_at, Job.world_size, Job.steps, Job.repeats,
           Job.verdict, Job.tags, Job.submitter, Job.queue, Job.params["name"].as_string().label("name"))
_JOB_ID = re.compile(r"#?(\d{1,9})")


def _utc(moment: datetime) -> datetime:
    """Without an offset a time is UTC; with one it is converted, since SQLite compares the stored UTC text."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _with_config(condition: ColumnElement[bool]) -> ColumnElement[bool]:
    """Jobs that ran a config matching `condition` (through runs.config_id's index)."""
    return Job.id.in_(select(Run.job_id).join(Config, Config.id == Run.config_id).where(condition))


def _contains(column: Any, text: str, *, dialect: str) -> ColumnElement[bool]:
    """Case-insensitive substring match. SQLite's LIKE already ignores ASCII case; lower() on every row
    would make a search over 100k jobs several times slower there."""
    if dialect == "sqlite":
        return column.contains(text, autoescape=True)
    return column.icontains(text, autoescape=True)


def conditions(query: JobsQuery, *, dialect: str = "postgresql") -> list[ColumnElement[bool]]:
    """The WHERE of a jobs query: every filter given must hold."""
    where: list[ColumnElement[bool]] = []
    if query.q and query.q.strip().startswith("#") and _JOB_ID.fullmatch(query.q.strip()):
        where.append(Job.id == int(query.q.strip()[1:]))  # "#12" is job 12, found through its key alone
    elif query.q and query.q.strip():
        text = query.q.strip()
        found = [_contains(Job.workload, text, dialect=dialect),
                 _with_config(_contains(Config.name, text, dialect=dialect)),
                 Job.id.in_(select(JobTag.job_id).where(_contains(JobTag.tag, text, dialect=dialect)))]
        if match := _JOB_ID.fullmatch(text):
            found.append(Job.id == int(match.group(1)))
        where.append(or_(*found))
    if query.workload:
        where.append(Job.workload == query.workload)
    if query.config:
        where.append(_with_config(Config.name == query.config))
    # One IN per tag: a job must carry all of them.
    where += [Job.id.in_(select(JobTag.job_id).where(JobTag.tag == tag)) for tag in dict.fromkeys(query.tag)]
    if query.kind:
        where.append(Job.kind.in_(query.kind))
    if query.status:
        where.append(Job.status.in_(query.status))
    if query.verdict:
        named = [v for v in query.verdict if v != "none"]
        either = [Job.verdict.in_(named)] if named else []
        if "none" in query.verdict:
            either.append(Job.verdict.is_(None))
        where.append(or_(*either))
    if query.submitter:
        where.append(Job.submitter == query.submitter)
    if query.created_after:
        where.append(Job.created_at >= _utc(query.created_after))
    if query.created_before:
        where.append(Job.created_at < _utc(query.created_before))
    return where


def _configs(*, session: Session, job_ids: list[int]) -> dict[int, list[tuple[str, int]]]:
    """(name, world size) of each job's configs in their order, from the first repeat's runs: one query."""
    out: dict[int, list[tuple[str, int]]] = {}
    if not job_ids:
        return out
    rows = session.execute(select(Run.job_id, Config.name, Run.world_size)
                           .join(Config, Config.id == Run.config_id)
                           .where(and_(Run.job_id.in_(job_ids), Run.repeat == 0))
                           .order_by(Run.job_id, Run.config_index))
    for job_id, name, world_size in rows:
        out.setdefault(job_id, []).append((name, world_size))
    return out


def list_jobs(*, session: Session, query: JobsQuery) -> tuple[list[dict[str, Any]], int]:
    """A page of jobs matching the query, as JobSummary fields, and how many match in all."""
    where = conditions(query, dialect=session.get_bind().dialect.name)
    total = session.scalar(select(func.count()).select_from(Job).where(*where)) or 0
    column = SORT_COLUMNS[query.sort]
    order = [column.desc(), Job.id.desc()] if query.order == "desc" else [column.asc(), Job.id.asc()]
    if column is Job.id:
        order = order[:1]
    # The page's ids first, from the indexes alone, then their rows: a deep offset skips index entries, not
    # whole rows.
    page = select(Job.id).where(*where).order_by(*order).limit(query.limit).offset(query.offset)
    rows = session.execute(select(*_LISTED).where(Job.id.in_(page.scalar_subquery())).order_by(*order)).all()
    configs = _configs(session=session, job_ids=[row.id for row in rows])
    items = []
    for row in rows:
        pairs = configs.get(row.id, [])
        items.append({**row._asdict(), "tags": list(row.tags or []), "config_names": [n for n, _ in pairs],
                      "world_sizes": [w for _, w in pairs]})
    return items, total
