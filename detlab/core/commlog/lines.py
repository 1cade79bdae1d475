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
    re.compile(r" *\d+: (?=\S)"),  # srun --label (right-aligned: " 5: " beside "10: ")
    re.compile(r"[A-Za-z][\w.\-]*: (?=\S)"),  # pdsh / deepspeed: "worker-1: "
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


# Terminal colours (Ray colours its "(RayWorkerWrapper pid=..)" prefixes).
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# A launcher prefix left at the end of a torn piece: it belongs to the writer whose line cut in.
_TRAILING_PREFIX = re.compile(
    r"(?:(?:\[\d+,\d+\]<(?:stdout|stderr)>:|\[(?:rank|default)\d+\]:|\((?:[\w.]+ )?pid=\d+(?:, ip=[\w.:\-]+)?\)"
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z?|\[\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\]"
    r"|(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\s*)+$"
)

_SLOT_BEFORE = re.compile(r"(?:\[\d+\] | *\d+: )$")  # slot tag, srun label


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
    line = _ANSI.sub("", line.lstrip("\ufeff"))
    for _ in range(8):
        for pattern in _PREFIXES:
            m = pattern.match(line)
            if m and m.end() > 0:
                line = line[m.end():]
                break
        else:
            return line
    return line


def _segments(line: str, hosts: frozenset[str] = frozenset()) -> list[tuple[str, bool, bool]]:
    """Cut a line where another writer's output starts: (piece, complete, clean cut after it).

    A piece followed by another writer's header in the same physical line was torn: its end is
    on some later line, so it is not read as it stands. The cut is clean when it is known exactly
    where the other writer's output starts: a bare marker, or a header whose host the log names at
    the start of some line (a host name glued to the torn text is cut back to the known host).
    """
    starts: list[tuple[int, bool]] = []
    for m in _BOUNDARY.finditer(line):
        start, clean = m.start(), m.group(0).startswith(("NCCL", "RCCL"))
        head = HEADER.match(line, start)
        if head and head["host"] not in hosts:
            known = max((h for h in hosts if head["host"].endswith(h)), key=len, default=None)
            if known is not None:
                start, clean = start + len(head["host"]) - len(known), True
        elif head:
            clean = True
        slot = _SLOT_BEFORE.search(line, 0, start) if clean else None
        if slot and slot.group(0).endswith(": ") and slot.start() > 0 and re.match(r"[\w\-]", line[slot.start() - 1]):
            clean = False  # "…to i0: " or "…P2P/I 5: ": where the torn text ends and the label starts is unknown
        elif slot:
            start = slot.start()  # "[0] NCCL INFO", "[0] host:..": the slot tag is the next writer's
        if start > 0:
            starts.append((start, clean))
    cuts = [(0, False), *starts, (len(line), False)]
    pieces = []
    for i in range(len(cuts) - 1):
        piece = strip_prefix(line[cuts[i][0]:cuts[i + 1][0]])
        pieces.append((piece, i == len(cuts) - 2, cuts[i + 1][1]))
    return pieces


def _continues(raw: str) -> bool:
    """Whether a physical line can be the rest of a torn line: no prefix, header or marker of its own."""
    return bool(raw) and strip_prefix(raw) == raw and not _BOUNDARY.search(raw) and not raw[0].isspace()


def records(text: str) -> list[Record]:
    """Turn a whole log into records.

    A line torn by another writer (its start, then the other writer's output, then its rest on the
    next line) is joined again when the next line is plainly a remainder (no prefix, header or
    marker of its own); any other torn fragment is skipped, never read as a whole line.
    """
    out: list[Record] = []
    torn: str | None = None
    lines = text.splitlines()
    hosts = frozenset(h["host"] for h in (HEADER.match(strip_prefix(_ANSI.sub("", raw))) for raw in lines) if h)
    for raw in lines:
        raw = _ANSI.sub("", raw.replace("\x00", "")).rstrip()
        if torn is not None and _continues(raw):
            raw = torn + raw
        torn = None
        line = strip_prefix(raw)
        if not line:
            continue
        for i, (piece, complete, clean) in enumerate(_segments(line, hosts)):
            if not complete:
                # The line's first piece, when it was a record's start, is the one whose rest follows
                # ("NCCL INFO " alone is RCCL's banner line, "NCCL INFO RCCL version : ..", cut at "RCCL version").
                start = _RECORD.search(piece)
                # A piece ending in "name: " may end in a pdsh label glued to the torn text: not joined.
                joinable = i == 0 and clean and not piece.endswith(": ")
                if joinable and start is not None and _TRAILING_PREFIX.sub("", start["msg"]).strip():
                    torn = _TRAILING_PREFIX.sub("", piece)
                continue
            if piece.strip():
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
