"""The Celery app shared by the API (which only sends) and the workers (which run tasks).

Redis when distributed; kombu's filesystem transport under the data dir when embedded. Celery
carries only "run this run id": the database is the source of truth.
"""

from __future__ import annotations

from celery import Celery

from backend.settings import Settings, get_settings

EXECUTE_RUN = "runs.execute"


def make_celery(settings: Settings) -> Celery:
    app = Celery("detlab", broker=settings.resolved_broker_url())
    conf: dict = {
        "task_ignore_result": True,
        "task_acks_late": True,
        "worker_prefetch_multiplier": 1,
        "task_default_queue": settings.queue,
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
    }
    if app.conf.broker_url.startswith("filesystem"):
        folder = str(settings.broker_folder())
        # Measured: ~50 ms polling keeps dispatch latency low without a busy loop.
        conf["broker_transport_options"] = {"data_folder_in": folder, "data_folder_out": folder,
                                            "control_folder": str(settings.broker_folder() / "control"),
                                            "polling_interval": 0.05}
    app.conf.update(conf)
    return app


_app: Celery | None = None


def celery_app() -> Celery:
    global _app
    if _app is None:
        _app = make_celery(get_settings())
    return _app


def dispatch(run_id: int, queue: str) -> None:
    """Send one run to a worker. Call only after the transaction that made the run is committed."""
    celery_app().send_task(EXECUTE_RUN, args=[run_id], queue=queue)
