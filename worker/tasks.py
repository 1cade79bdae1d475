"""Celery tasks (thin: the logic is in runner.py) and the worker's heartbeat, whose reply can stop the run."""

from __future__ import annotations

import logging
import socket
import threading

from celery import Celery
from celery.signals import worker_ready, worker_shutdown

from detlab.core.broker import EXECUTE_RUN, celery_conf
from detlab.core.ingest_client import IngestClient
from detlab.core.settings import get_settings
from detlab.core.wire import WorkerInfo
from detlab.worker import runner
from detlab.worker.launch import node_capacity
from detlab.worker.workloads import describe

log = logging.getLogger(__name__)
app = Celery("detlab")
app.conf.update(celery_conf(get_settings()))
_stop = threading.Event()


def worker_name() -> str:
    return f"{socket.gethostname()}:{get_settings().queue}"


def ingest_client() -> IngestClient:
    settings = get_settings()
    return IngestClient(settings.api_url, settings.resolved_worker_token(), retry_for_s=settings.ingest_retry_s)


@app.task(name=EXECUTE_RUN, bind=True, acks_late=True)
def execute_run(self, run_id: int) -> str:  # type: ignore[no-untyped-def]
    settings = get_settings()
    return runner.execute(run_id, client=ingest_client(), worker=worker_name(), device=settings.device,
                          hang_timeout_s=settings.hang_timeout_s, first_step_timeout_s=settings.first_step_timeout_s)


def _beat() -> None:
    settings = get_settings()
    client = IngestClient(settings.api_url, settings.resolved_worker_token(), retries=0)
    # What this node can run, and how many ranks: the server refuses jobs its queue's workers cannot hold.
    info = WorkerInfo(workloads=describe(), capacity=node_capacity(settings.device, settings.cpu_ranks_per_core))
    while not _stop.wait(settings.heartbeat_interval_s):
        run_id, attempt, lease = runner.CURRENT.now_leased()
        try:
            ack = client.heartbeat(worker_name(), settings.queue, run_id, attempt, info, lease)
        except Exception as exc:  # noqa: BLE001 - the API may be restarting; keep beating
            log.warning("heartbeat failed: %s", exc)
            continue
        if ack.stop and run_id is not None:  # cancelled or taken over: the runner kills its ranks
            runner.CURRENT.stop(run_id, attempt, ack.reason or f"the server stopped run {run_id}")


@worker_ready.connect
def _start_heartbeat(**_kwargs) -> None:  # type: ignore[no-untyped-def]
    threading.Thread(target=_beat, name="detlab-heartbeat", daemon=True).start()


@worker_shutdown.connect
def _stop_heartbeat(**_kwargs) -> None:  # type: ignore[no-untyped-def]
    _stop.set()
