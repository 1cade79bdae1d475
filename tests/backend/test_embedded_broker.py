"""The embedded broker (a folder): a worker that polls it while the server is writing a message never reads the
message half-written. kombu's own filesystem send creates the file and then writes it: a worker polling in
between read an empty file, failed to decode it and exited ("Unrecoverable error: JSONDecodeError"), and every
job sent later stayed queued (seen in CI: an embedded stack's worker died and its tests waited out their time)."""

from __future__ import annotations

import sys
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from celery import Celery

from detlab.backend.services import dispatch
from detlab.core.broker import celery_conf
from detlab.core.settings import Settings


def test_a_message_the_server_is_writing_is_not_read_by_a_polling_worker(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(data_dir=tmp_path)
    monkeypatch.setattr(dispatch, "get_settings", lambda: settings)
    dispatch.celery_app.cache_clear()
    try:
        server = dispatch.celery_app().connection_for_write().default_channel
    finally:
        dispatch.celery_app.cache_clear()
    worker_app = Celery("detlab")  # as worker/tasks.py builds its app
    worker_app.conf.update(celery_conf(settings))
    worker = worker_app.connection_for_read().default_channel

    # The worker polls at the moment the server's send has made its file and not yet written it.
    module = sys.modules[type(server)._put.__module__]
    encode = module.dumps
    polled: list[Any] = []

    def encode_while_polled(payload: Any) -> str:
        try:
            polled.append(worker._get(settings.queue))
        except Empty:
            polled.append(None)
        return encode(payload)

    monkeypatch.setattr(module, "dumps", encode_while_polled)
    server._put(settings.queue, {"body": "run 7"})
    assert polled == [None]  # nothing to read yet, rather than an empty file
    assert worker._get(settings.queue) == {"body": "run 7"}  # then the whole message
    with pytest.raises(Empty):
        worker._get(settings.queue)
