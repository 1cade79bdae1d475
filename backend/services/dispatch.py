"""Sends runs to workers through Celery: only the run id travels, the database holds the rest."""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

import redis
from celery import Celery
from kombu.exceptions import OperationalError
from sqlalchemy import update
from sqlalchemy.orm import Session

from detlab.backend.models import QUEUED, Run
from detlab.backend.services import embedded_broker
from detlab.core.broker import EXECUTE_RUN, celery_conf
from detlab.core.settings import Settings, get_settings

# What a send raises while the broker is down or unreachable (kombu wraps most socket errors).
BROKER_DOWN = (OperationalError, OSError, redis.RedisError)
# Seconds a send, or a health check, waits to connect: a broker that is down must not hold a request.
CONNECT_TIMEOUT_S = 2.0


@lru_cache(maxsize=1)
def celery_app() -> Celery:
    app = Celery("detlab")
    app.conf.update(celery_conf(get_settings()))
    if app.conf.broker_url.startswith("redis"):
        app.conf.broker_transport_options = {**(app.conf.broker_transport_options or {}),
                                             "socket_connect_timeout": CONNECT_TIMEOUT_S}
    elif app.conf.broker_url.startswith("filesystem"):
        app.conf.broker_transport = embedded_broker.PATH  # messages appear whole (embedded_broker)
    return app


def dispatch(run_id: int, queue: str) -> None:
    """Send one run to a worker. Call only after the transaction that made the run is committed.
    Raises one of BROKER_DOWN when the broker cannot take it."""
    celery_app().send_task(EXECUTE_RUN, args=[run_id], queue=queue)


def send(pending: list[tuple[int, str]]) -> list[int]:
    """Send each (run_id, queue) after the commit; returns the run ids not sent because the broker is down
    (the first failure stops the pass: the rest would wait out the same timeout)."""
    for index, (run_id, queue) in enumerate(pending):
        try:
            dispatch(run_id, queue)
        except BROKER_DOWN:
            return [r for r, _ in pending[index:]]
    return []


def undispatch(*, session: Session, run_ids: Iterable[int]) -> None:
    """Mark queued runs whose send failed as never sent: the reconciler sends them on its next pass."""
    ids = list(run_ids)
    if ids:
        session.execute(update(Run).where(Run.id.in_(ids), Run.status == QUEUED).values(dispatched_at=None))
        session.flush()


def broker_state(settings: Settings) -> str:
    """'ok' when the broker answers within CONNECT_TIMEOUT_S, else what is wrong (cheap: one PING)."""
    url = settings.resolved_broker_url()
    if not url.startswith("redis"):
        return "ok"  # the embedded broker: a folder under the data dir, up while this process is
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=CONNECT_TIMEOUT_S)
        try:
            client.ping()
        finally:
            client.close()
    except redis.RedisError as exc:
        return f"unreachable: {str(exc)[:200]}"
    return "ok"
