"""Sends runs to workers through Celery: only the run id travels, the database holds the rest."""

from __future__ import annotations

from functools import lru_cache

from celery import Celery

from detlab.core.broker import EXECUTE_RUN, celery_conf
from detlab.core.settings import get_settings


@lru_cache(maxsize=1)
def celery_app() -> Celery:
    app = Celery("detlab")
    app.conf.update(celery_conf(get_settings()))
    return app


def dispatch(run_id: int, queue: str) -> None:
    """Send one run to a worker. Call only after the transaction that made the run is committed."""
    celery_app().send_task(EXECUTE_RUN, args=[run_id], queue=queue)
