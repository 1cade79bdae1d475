"""The embedded broker's sending side: kombu's filesystem transport, each message seen only once it is whole.

kombu's filesystem `_put` creates the message file in the folder the worker polls, then writes it. A worker that
lists the folder in between moves the empty file away, fails to decode it and stops its consumer for good
(Celery's "Unrecoverable error: JSONDecodeError"): the worker process exits and every job sent after it stays
queued. Here a message is written under a name the worker never reads (no `.<queue>.msg` suffix) and then renamed
to its queue name, which is atomic within one folder. Only the server sends on the embedded broker, so only its
Celery app takes this transport (dispatch.celery_app).
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import dumps

PATH = "detlab.backend.services.embedded_broker:Transport"


class Channel(filesystem.Channel):
    # kombu's filesystem channel declares _put(queue, payload, **kwargs), its base _put(queue, message): either
    # signature contradicts the other.
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        # The name kombu gives a message: the worker takes them in the order of the names.
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        partial = os.path.join(self.data_folder_out, f"partial-{uuid.uuid4().hex}")  # no dot: no queue's
        try:
            with open(partial, "wb") as f:
                f.write(dumps(payload).encode())
            os.replace(partial, os.path.join(self.data_folder_out, name))
        except OSError as exc:
            raise ChannelError(f"Cannot add file {name!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
