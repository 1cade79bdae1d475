"""The rank launcher: spawns W ranks of a rank program torchrun-style, watches them, reads their spools.

Used by the worker's runner (one claimed run) and by `detlab verify-collective` (no server). Each
rank is `python -m <program> spec.json` with torchrun's variables (MASTER_ADDR, MASTER_PORT, RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE) on top of the environment its caller gives it, and appends
`Record` lines to `rank<r>.jsonl` in the run's folder; its stdout and stderr go to `rank<r>.stderr`, its pid to
`rank<r>.pid`. Ranks of detlab's own rank programs are forked from a zygote where their environment allows
(detlab.worker.zygote).
Each rank leads a process group of its own, and the whole group is killed when the ranks end, however
they end (done, failed, hung, or stopped because the server cancelled the run).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeAlias

from detlab.core.wire import MAX_WORLD_SIZE, RECORD, RankSpec, Record, WorkerCapacity
from detlab.worker import zygote
from detlab.worker.zygote import Forked, Zygote, die_with_parent

Rank: TypeAlias = "subprocess.Popen[bytes] | Forked"

RANK_PROGRAMS = {"train": "detlab.worker.ranks.train", "collective": "detlab.worker.ranks.collective",
                 "batch-invariance": "detlab.worker.ranks.diagnose", "op-audit": "detlab.worker.ranks.diagnose"}
# What a worker's zygote preloads (a test that points a kind at a program of its own gets fresh processes).
PRELOADED = tuple(RANK_PROGRAMS.values())
# Records that are a run's progress (a step, a collective trial, a diagnosis result): before a rank's first,
# it may take first_step_timeout_s (building, compiling, tracing); after it, hang_timeout_s between records.
PROGRESS_RECORDS = ("step", "trial", "invariance", "model-invariance", "audit-op")


class RankFailed(RuntimeError):
    """A rank exited non-zero, or the ranks were killed for making no progress or running too long."""


class RanksTimedOut(RankFailed):
    """The ranks were killed for making no progress or running too long."""


class RanksStopped(Exception):
    """The ranks were killed because their run is no longer wanted (cancelled, or taken over): not a failure."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_capacity(device: Literal["auto", "cpu", "cuda"], ranks_per_core: int) -> WorkerCapacity:
    """How many ranks of one run this node can launch, as the heartbeat reports it: one per GPU when its
    ranks run on GPUs (nccl), `ranks_per_core` per CPU core it may use otherwise (gloo)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    gpus, versions = 0, {}
    if device != "cpu":
        import torch  # the worker holds torch; counting creates no CUDA context (ranks pick GPUs the same way)

        gpus = torch.cuda.device_count()
        versions = {"torch": torch.__version__, "cuda": torch.version.cuda}
    on_gpu = device == "cuda" or (device == "auto" and gpus > 0)
    return WorkerCapacity(device="cuda" if on_gpu else "cpu", gpus=min(gpus, MAX_WORLD_SIZE), cpu_cores=cores,
                          ranks_per_core=ranks_per_core, **(versions if on_gpu else {}))


def kill_groups(procs: list[Rank]) -> None:
    """SIGKILL each rank's process group (the rank and whatever it spawned), then reap the ranks.

    Every rank leads a group of its own (start_new_session), so a data-loader worker or compiler process it
    started goes with it. A group whose leader already exited is killed too: its children may remain."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone already
    for p in procs:
        p.wait()


def torchrun_env(base: dict[str, str], rank: int, world_size: int, port: int, threads: int | None) -> dict[str, str]:
    """`base` with torchrun's variables for `rank` of `world_size` on this host (and OMP_NUM_THREADS)."""
    env = {**base, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
           "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
           "PYTHONUNBUFFERED": "1"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


@dataclass
class SpoolReader:
    """Reads complete new lines from the ranks' spool files (a torn last line waits for the rest), and notes
    when each rank's spool last advanced and whether it has recorded a step (or a collective trial) yet."""

    folder: Path
    offsets: dict[Path, int] = field(default_factory=dict)
    advanced_at: dict[int, float] = field(default_factory=dict)  # rank -> time.monotonic() of its last record
    stepped: set[int] = field(default_factory=set)

    def read(self) -> list[Record]:
        out: list[Record] = []
        now = time.monotonic()
        for path in sorted(self.folder.glob("rank*.jsonl")):
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + end
            records = [RECORD.validate_json(line) for line in data[:end].splitlines() if line.strip()]
            if records and path.stem.removeprefix("rank").isdigit():
                rank = int(path.stem.removeprefix("rank"))
                self.advanced_at[rank] = now
                if any(r.type in PROGRESS_RECORDS for r in records):
                    self.stepped.add(rank)
            out += records
        return out


def stalled_ranks(running: list[int], *, advanced_at: dict[int, float], stepped: set[int], started: float,
                  now: float, hang_timeout_s: float, first_step_timeout_s: float) -> list[int]:
    """The running ranks past their limit: `first_step_timeout_s` from the start until their first step (model
    building, NCCL init and compiling come first), `hang_timeout_s` since their last record after it."""
    return [r for r in running
            if (now - advanced_at.get(r, started) > hang_timeout_s if r in stepped
                else now - started > first_step_timeout_s)]


def tail(path: Path, limit: int = 4000) -> str:
    """The last `limit` bytes of a file as text ('' when there is none)."""
    data = path.read_bytes() if path.exists() else b""
    return data[-limit:].decode(errors="replace")


def hang_error(stalled: list[int], progressing: list[int], folder: Path, limit_s: float) -> RanksTimedOut:
    """Which ranks stopped making progress (all of them when none is `progressing`), and the end of their output
    (the first few ranks' only)."""
    ranks = ", ".join(map(str, stalled))
    if progressing:
        head = (f"rank{'s' if len(stalled) > 1 else ''} {ranks} made no progress for {limit_s:.0f} s while "
                f"rank{'s' if len(progressing) > 1 else ''} {', '.join(map(str, progressing))} did; killed")
    else:
        head = f"no progress from any rank ({ranks}) for {limit_s:.0f} s; killed"
    return RanksTimedOut(head + output_tails(stalled, folder))


PEER_EXIT_GRACE_S = 3.0


def wait_for_exits(procs: list[Rank], grace_s: float) -> list[int | None]:
    """Each process's exit code once all have exited or `grace_s` has passed (None: still running)."""
    deadline = time.monotonic() + grace_s
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p.poll() for p in procs]


def output_tails(ranks: list[int], folder: Path) -> str:
    """The end of the first few ranks' output, 4000 bytes shared between them."""
    shown = ranks[:4]
    return "".join(f"\nrank {r}'s output ends:\n{tail(folder / f'rank{r}.stderr', 4000 // len(shown))}"
                   for r in shown)


def launch_ranks(spec: RankSpec, folder: Path, *, env: Callable[[int], dict[str, str]] = lambda _rank: dict(os.environ),
                 on_records: Callable[[list[Record]], None], hang_timeout_s: float | None = None,
                 first_step_timeout_s: float | None = None,
                 timeout_s: float | None = None, poll_s: float = 0.2, tie_to_parent: bool = False,
                 stop: Callable[[], str | None] = lambda: None, argv: Sequence[str] | None = None,
                 cwd: Path | None = None, forks: Zygote | None = None) -> None:
    """Run `spec.world_size` ranks of the spec's program in `folder` until all exit 0.

    `env(rank)` is the rank's environment before the torchrun variables. Records are handed to
    `on_records` as the ranks spool them, and what they wrote before a failure is handed on too. Raises
    RankFailed (after killing the other ranks) when one exits non-zero, RanksTimedOut naming the ranks and
    keeping their output's end when a running rank wrote no record for `hang_timeout_s` (for
    `first_step_timeout_s`, by default the same, from the start until its first step), or when the ranks run
    past `timeout_s`. `tie_to_parent`: ranks die with this process.
    `stop()` is asked every poll; a reason kills the ranks' process groups and raises RanksStopped (what they
    wrote after the last hand-on is not handed on: the run no longer takes records). Whatever ends the
    ranks, their process groups are killed before this returns.
    `argv`: each rank runs this command (a registered script, in `cwd`) instead of the spec's rank program;
    it spools where the spec's program would, through detlab.Recorder (DETLAB_RUN_DIR).
    A rank of a rank program is forked from `forks` (by default this process's zygote, detlab.worker.zygote) when
    its environment allows; forked ranks always die with this process.
    """
    spec_path = folder / "spec.json"
    spec_path.write_text(spec.model_copy(update={"spool_dir": str(folder)}).model_dump_json())
    port, world = free_port(), spec.world_size
    envs = [torchrun_env(env(rank), rank, world, port, spec.threads) for rank in range(world)]  # may refuse
    reader, procs = SpoolReader(folder), []
    failure: RankFailed | None = None
    module = None if argv else RANK_PROGRAMS[spec.kind]
    forks = forks or (zygote.shared(PRELOADED) if module in PRELOADED else None)
    try:
        for rank in range(world):
            out = folder / f"rank{rank}.stderr"
            if module and forks and forks.forkable(module, envs[rank]):
                out.write_bytes(b"")
                procs.append(forks.fork(module, [str(spec_path)], envs[rank], str(cwd or Path.cwd()), str(out)))
            else:
                with out.open("wb") as err:  # the child keeps its own copy
                    command = list(argv) if argv else [sys.executable, "-m", str(module), str(spec_path)]
                    procs.append(subprocess.Popen(command, env=envs[rank], cwd=cwd, stdout=err,
                                                  stderr=subprocess.STDOUT, start_new_session=True,
                                                  preexec_fn=die_with_parent if tie_to_parent else None))
            # Which process is which rank (a forked rank's command line is its zygote's): for operators and tests.
            (folder / f"rank{rank}.pid").write_text(str(procs[-1].pid))
        started = time.monotonic()
        first_step_s = max(first_step_timeout_s or 0.0, hang_timeout_s) if hang_timeout_s is not None else None
        while True:
            records = reader.read()
            if records:
                on_records(records)
            if reason := stop():
                raise RanksStopped(reason)
            codes = [p.poll() for p in procs]
            bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                # When one rank dies its peers' collectives fail too, and which of them a poll sees first is
                # a race: the peers get a moment to exit, and every rank that failed by then is named.
                codes = wait_for_exits(procs, PEER_EXIT_GRACE_S)
                bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
                failure = RankFailed("; ".join(f"rank {r} exited with code {codes[r]}" for r in bad)
                                     + output_tails(bad, folder))
                break
            if all(c == 0 for c in codes):
                break
            now = time.monotonic()
            running = [r for r, c in enumerate(codes) if c is None]
            if hang_timeout_s is not None and first_step_s is not None and (stalled := stalled_ranks(
                    running, advanced_at=reader.advanced_at, stepped=reader.stepped, started=started, now=now,
                    hang_timeout_s=hang_timeout_s, first_step_timeout_s=first_step_s)):
                # Ranks silent for half their limit hang with it (they wrote a poll or two later): named too.
                quiet = stalled_ranks(running, advanced_at=reader.advanced_at, stepped=reader.stepped,
                                      started=started, now=now, hang_timeout_s=hang_timeout_s / 2,
                                      first_step_timeout_s=first_step_s / 2)
                progressing = [r for r in running if r not in quiet]
                limit = hang_timeout_s if stalled[0] in reader.stepped else first_step_s
                failure = hang_error(stalled if progressing else quiet, progressing, folder, limit)
                break
            if timeout_s is not None and now - started > timeout_s:
                failure = RanksTimedOut(f"ranks still running after {timeout_s:.0f} s; killed")
                break
            time.sleep(poll_s)
    finally:
        kill_groups(procs)
    rest = reader.read()  # what ranks wrote before exiting or being killed is kept
    if rest:
        on_records(rest)
    if failure:
        raise failure
