"""Split raw NCCL/RCCL debug output into records, undoing what launchers and writers did to it."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Launcher and logger prefixes, tried repeatedly at the start of a line (they stack, e.g. a
# timestamp in front of mpirun's tag).
_PREFIXES = [
    re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z?\s*"),  # k8s / docker log timestamp
    re.compile(r"\[\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\]\s*"),  # [2025-11-24 11:20:21]
    re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? - \w+ - "),  # python logging
    re.compile(r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) \w{3} +\d+ \d\d:\d\d:\d\d \d{4}\s*"),  # mpirun --timestamp-output
    re.compile(r"\[\d+,\d+\]<(?:stdout|stderr)>:\s?"),  # mpirun --tag-output
    re.compile(r"\((?:[\w.]+ )?pid=\d+(?:, ip=[\w.:\-]+)?\)\s*"),  # Ray: (pid=1) / (RayTrainWorker pid=1, ip=..)
    re.compile(r"\[(?:rank|default)\d+\]:\s?"),  # torchrun --tee / log prefixes
    re.compile(r"\d+: (?=\S)"),  # srun --label
    re.compile(r"\[\d+\] (?=\S)"),  # horovod/mpi slot tags: "[155] host:pid:tid ..."
]

# "host:pid:tid [dev]" as NCCL's debug.cc prints it before every INFO/WARN line.
_HEADER_TEXT = r"[A-Za-z0-9_.\-<>]+:\d+:\d+ \[\d+\] "
HEADER = re.compile(r"(?P<host>[A-Za-z0-9_.\-<>]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] ")
# Where a new writer's output can start in the middle of a line: a full header, a short
# "host [dev] " header (NCCL_DEBUG_TIMESTAMP_FORMAT era) or a bare marker, or the version banner.
_BOUNDARY = re.compile(
    r"(?:" + _HEADER_TEXT + r"|[A-Za-z0-9_.\-]+ \[\d+\] )?(?:\S+:\d+ )?(?:NCCL|RCCL) (?:INFO|WARN|TRACE|ABORT)\b"
    r"|" + _HEADER_TEXT + r"|(?:NCCL|RCCL) version"
)
_RECORD = re.compile(
    r"(?:(?P<src>\S+:\d+) )?(?P<lib>NCCL|RCCL) (?P<level>INFO|WARN|TRACE|ABORT)\b ?(?P<msg>.*)"
)


@dataclass(frozen=True)
class Record:
    """One NCCL message: where it came from (when the line said) and its text."""

    level: str  # INFO, WARN, TRACE, ABORT, or TEXT for unmarked lines (banners)
    msg: str
    src: str | None = None  # "misc/socket.cc:484" printed before WARN
    host: str | None = None
    pid: int | None = None
    dev: int | None = None

    @property
    def process(self) -> str | None:
        return f"{self.host}:{self.pid}" if self.host is not None else None


def strip_prefix(line: str) -> str:
    """Remove launcher, logger and timestamp prefixes from the start of one log line."""
    line = line.lstrip("\ufeff")
    for _ in range(8):
        for pattern in _PREFIXES:
            m = pattern.match(line)
            if m and m.end() > 0:
                line = line[m.end():]
                break
        else:
            return line
    return line


def _segments(line: str) -> list[tuple[str, bool]]:
    """Cut a line where another writer's output starts; each piece says whether it is complete.

    A piece followed by another writer's header in the same physical line was torn: its end is
    on some later line, so nothing is read from it.
    """
    starts = [m.start() for m in _BOUNDARY.finditer(line) if m.start() > 0]
    cuts = [0, *starts, len(line)]
    pieces = []
    for i in range(len(cuts) - 1):
        piece = strip_prefix(line[cuts[i]:cuts[i + 1]])
        pieces.append((piece, i == len(cuts) - 2))
    return pieces


def records(text: str) -> list[Record]:
    """Turn a whole log into records, skipping torn fragments."""
    out: list[Record] = []
    for raw in text.splitlines():
        line = strip_prefix(raw.replace("\x00", "").rstrip())
        if not line:
            continue
        for piece, complete in _segments(line):
            if not complete or not piece.strip():
                continue
            out.append(_record(piece))
    return out


def _record(piece: str) -> Record:
    host = pid = dev = None
    head = HEADER.match(piece)
    rest = piece
    if head:
        host, pid, dev = head["host"], int(head["pid"]), int(head["dev"])
        rest = piece[head.end():]
    m = _RECORD.search(rest)
    if m:
        return Record(level=m["level"], msg=m["msg"].strip(), src=m["src"], host=host, pid=pid, dev=dev)
    return Record(level="TEXT", msg=rest.strip(), host=host, pid=pid, dev=dev)
