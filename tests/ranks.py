"""Scripts that tests launch as ranks: `python` for one rank, `torchrun --standalone` for more, in an environment
without an outer launch's RANK / WORLD_SIZE / LOCAL_RANK.

A launch that runs past its limit (well under pytest-timeout's 300 s) has every process under it aborted, so the
failure shows each rank's Python stack (PYTHONFAULTHANDLER) with the end of what it printed. Without this, a hang
showed nothing and left ranks running: torchrun starts each rank in a session of its own, so neither a signal to
torchrun's process group nor subprocess.run's timeout (which kills torchrun alone) reaches them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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
    """Every process under `pid`, children before their own children (from /proc)."""
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


def _signal(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def finish_ranks(proc: subprocess.Popen[str], limit_s: float = LIMIT_S) -> subprocess.CompletedProcess[str]:
    """Wait for a launch from `start_ranks`; past `limit_s`, abort every process under it, the deepest first,
    then the launch itself, and fail with what they printed."""
    try:
        out, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        tree = _descendants(proc.pid)
        _signal([*reversed(tree), proc.pid], signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            _signal([*tree, proc.pid], signal.SIGKILL)
            out, err = proc.communicate()
        raise AssertionError(f"{proc.args!r} ran past {limit_s:g} s; every process under it was "
                             f"aborted:\n{(out or '')[-6000:]}\n{(err or '')[-6000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_ranks(argv: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
              merge_output: bool = False, limit_s: float = LIMIT_S) -> subprocess.CompletedProcess[str]:
    """`start_ranks` then `finish_ranks`."""
    return finish_ranks(start_ranks(argv, env=env, cwd=cwd, merge_output=merge_output), limit_s)
