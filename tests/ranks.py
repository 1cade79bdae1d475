"""Scripts that tests launch as ranks: `python` for one rank, `torchrun --standalone` for more, in an environment
without an outer launch's RANK / WORLD_SIZE / LOCAL_RANK.

A launch that runs past its limit (well under pytest-timeout's 300 s) has every process under it aborted, so the
failure shows each rank's Python stack (PYTHONFAULTHANDLER) with the end of what it printed. Without this, a hang
showed nothing and left ranks running: torchrun starts each rank in a session of its own, so neither a signal to
torchrun's process group nor subprocess.run's timeout (which kills torchrun alone) reaches them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

TORCHRUN = Path(sys.executable).parent / "torchrun"
# A launch takes 5 to 50 s on a loaded 2-core machine.
LIMIT_S = 180.0


def launcher(ranks: int) -> list[str]:
    """The command that starts a script as `ranks` ranks (--standalone: torchrun picks a free port itself)."""
    return [sys.executable] if ranks == 1 else [str(TORCHRUN), "--standalone", "--nproc-per-node", str(ranks)]


def rank_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}


def start_ranks(argv: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
                merge_output: bool = False) -> subprocess.Popen[str]:
    """Start `argv` (stdout and stderr piped; `merge_output`: stderr into stdout) in a session of its own."""
    env = dict(rank_env() if env is None else env, PYTHONFAULTHANDLER="1")
    return subprocess.Popen(list(argv), env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge_output else subprocess.PIPE, text=True,
                            start_new_session=True)


def _descendants(pid: int) -> list[int]:
    """Every process under `pid`, parents before their children (from /proc)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # a process that ended while being read
            continue
        parents.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def running(pid: int) -> bool:
    """Whether process `pid` exists and has not ended (a zombie has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _abort(pids: Sequence[int]) -> None:
    """SIGABRT each in turn, waiting (up to 10 s) until it has ended before the next: the stacks they print into
    one pipe do not interleave, and a launcher aborted before its ranks cannot end them first its own way
    (torchrun sends SIGTERM, which prints no stack)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGABRT)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + 10
        while running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)


def finish_ranks(proc: subprocess.Popen[str], limit_s: float = LIMIT_S) -> subprocess.CompletedProcess[str]:
    """Wait for a launch from `start_ranks`; past `limit_s`, abort the launch and every process under it, one at
    a time from the top, and fail with what they printed."""
    try:
        out, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        tree = [proc.pid, *_descendants(proc.pid)]  # read first: aborted parents' children move to init
        _abort(tree)
        for pid in filter(running, tree):  # what SIGABRT did not end (a process stuck writing into a full pipe)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{proc.args!r} ran past {limit_s:g} s; every process under it was "
                             f"aborted:\n{(out or '')[-6000:]}\n{(err or '')[-6000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_ranks(argv: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
              merge_output: bool = False, limit_s: float = LIMIT_S) -> subprocess.CompletedProcess[str]:
    """`start_ranks` then `finish_ranks`."""
    return finish_ranks(start_ranks(argv, env=env, cwd=cwd, merge_output=merge_output), limit_s)
