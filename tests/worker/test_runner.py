"""The worker's launch environment, spool reading and rank launcher (plain functions, no Celery)."""

from __future__ import annotations

import os
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from detlab.core.ingest_client import BadSpec
from detlab.core.wire import RankSpec, RunSpec, StepRecord
from detlab.worker import launch, runner
from detlab.worker.launch import RankFailed, RanksStopped, RanksTimedOut, SpoolReader, launch_ranks, torchrun_env
from detlab.worker.runner import child_env
from detlab.worker.zygote import Zygote
from tests.ranks import running

DIGEST = "fp1:" + "0" * 32


def run_spec(**env: str) -> RunSpec:
    return RunSpec(run_id=1, attempt=1, kind="train", workload="mlp", world_size=4, steps=3, env=env)


def step(n: int) -> StepRecord:
    return StepRecord(step=n, rank=0, fp_version="fp1", model_digest=DIGEST, digests="ab" * 16, loss_bits="",
                      step_time_s=0.0)


def test_child_env_refuses_a_variable_outside_the_allow_list(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="LD_PRELOAD is not an allowed variable"):
        child_env(run_spec(LD_PRELOAD="/tmp/x.so"), 0, tmp_path)


def test_a_rank_env_is_torchrun_style_with_one_nccl_log_per_rank(tmp_path: Path) -> None:
    base = child_env(run_spec(NCCL_ALGO="Ring", NCCL_DEBUG_SUBSYS="INIT", OMP_NUM_THREADS="8"), 2, tmp_path)
    env = torchrun_env(base, 2, 4, 1234, threads=3)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]) == ("2", "2", "4", "1234")
    assert env["NCCL_DEBUG_FILE"] == str(tmp_path / "nccl-rank2.log")
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_ALGO"] == "Ring"
    assert env["NCCL_DEBUG_SUBSYS"] == "INIT"  # the config wins over the worker's default
    assert env["OMP_NUM_THREADS"] == "3"  # the run's threads win over the config's env


def test_spool_reader_waits_for_the_rest_of_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    first, second = step(1).model_dump_json(), step(2).model_dump_json()
    path.write_text(first + "\n" + second[:20])
    reader = SpoolReader(tmp_path)
    assert reader.read() == [step(1)]
    with path.open("a") as f:
        f.write(second[20:] + "\n")
    assert reader.read() == [step(2)]
    assert reader.read() == []


def test_spool_reader_refuses_a_line_that_is_no_record(tmp_path: Path) -> None:
    (tmp_path / "rank0.jsonl").write_text('{"type": "step", "step": 1}\n')
    with pytest.raises(ValueError, match="model_digest"):
        SpoolReader(tmp_path).read()


# ---- the launcher, on a stand-in rank program ------------------------------------------------------

FAKE_RANK = """
import os, sys, time
from pathlib import Path
from detlab.core.wire import RankSpec, StepRecord
spec = RankSpec.model_validate_json(Path(sys.argv[1]).read_text())
rank = int(os.environ["RANK"])
behaviour = os.environ["FAKE"]
if behaviour == "slow-first-step":  # model building, NCCL init or compiling before step 0
    time.sleep(3)
with open(Path(spec.spool_dir) / f"rank{rank}.jsonl", "a") as f:
    f.write(StepRecord(step=0, rank=rank, fp_version="fp1", model_digest="fp1:" + "0" * 32, digests="",
                       loss_bits="", step_time_s=0.0).model_dump_json() + "\\n")
    f.flush()
    if behaviour == "crash" and rank == 1:
        print("rank 1 says goodbye", flush=True)
        sys.exit(3)
    if behaviour == "crash-all":  # both fail, rank 1 half a second after rank 0 (the cause can exit last)
        print(f"rank {rank} fails too", flush=True)
        (Path(spec.spool_dir) / f"failing{rank}").touch()
        while len(list(Path(spec.spool_dir).glob("failing*"))) < spec.world_size:
            time.sleep(0.01)
        if rank == 1:
            time.sleep(0.5)
        sys.exit(3 if rank == 1 else 1)
    if behaviour == "hang":
        print(f"rank {rank} waits in allreduce", flush=True)
        time.sleep(60)
    if behaviour == "stall-1":  # rank 1 stops; the others go on stepping for a while, then finish
        if rank == 1:
            print("rank 1 waits in allreduce", flush=True)
            time.sleep(60)
        for n in range(1, 40):
            time.sleep(0.2)
            f.write(StepRecord(step=n, rank=rank, fp_version="fp1", model_digest="fp1:" + "0" * 32, digests="",
                               loss_bits="", step_time_s=0.0).model_dump_json() + "\\n")
            f.flush()
if behaviour.startswith("spawn"):  # a child of its own, as a data-loader worker or a compiler would be
    import subprocess
    child = subprocess.Popen(["sleep", "60"])
    # Written whole (then renamed): the test reads it while this rank runs, and an empty file is not a pid.
    partial = Path(spec.spool_dir) / f"child{rank}.pid.partial"
    partial.write_text(str(child.pid))
    partial.replace(Path(spec.spool_dir) / f"child{rank}.pid")
    if behaviour == "spawn-and-wait":
        time.sleep(60)
"""


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding `fakeranks.rank`: a rank program that spools one step record, then exits 0, crashes (rank 1)
    or hangs, per $FAKE."""
    root = tmp_path_factory.mktemp("fake")
    (root / "fakeranks").mkdir()
    (root / "fakeranks" / "__init__.py").write_text("")
    (root / "fakeranks" / "rank.py").write_text('if __name__ == "__main__":\n' + textwrap.indent(FAKE_RANK, "    "))
    return root


@pytest.fixture
def fake_rank(fake_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The run folder of a launch whose `train` ranks run fakeranks.rank (env_for(behaviour) sets $FAKE)."""
    monkeypatch.setitem(launch.RANK_PROGRAMS, "train", "fakeranks.rank")
    monkeypatch.setenv("PYTHONPATH", python_path(fake_root))
    folder = tmp_path / "run"
    folder.mkdir()
    return folder


@pytest.fixture(scope="module")
def fake_zygote(fake_root: Path) -> Iterator[Zygote]:
    """A zygote that forks fakeranks.rank (as a worker's forks its rank programs), in the environment fake_rank
    gives the tests."""
    zygote = Zygote(["fakeranks.rank"], env={**os.environ, "PYTHONPATH": python_path(fake_root)}, lazy_env=["FAKE"])
    yield zygote
    zygote.close()


@pytest.fixture(params=["fresh", "forked"])
def forks(request: pytest.FixtureRequest) -> Iterator[Zygote | None]:
    """How the launcher starts the fake ranks: as fresh processes, or forked from a zygote (checked to have forked)."""
    if request.param == "fresh":
        yield None
        return
    zygote = request.getfixturevalue("fake_zygote")
    before = len(zygote.exits)
    yield zygote
    assert len(zygote.exits) > before


PYTHONPATH = os.environ.get("PYTHONPATH")


def python_path(fake_root: Path) -> str:
    return os.pathsep.join(p for p in (str(fake_root), PYTHONPATH) if p)


def rank_spec(world: int) -> RankSpec:
    return RankSpec(kind="train", workload="mlp", world_size=world, steps=1)


def env_for(behaviour: str) -> Any:
    return lambda rank: {**os.environ, "FAKE": behaviour}


def test_launcher_hands_on_every_rank_record_when_all_exit_0(fake_rank: Path) -> None:
    got: list[Any] = []
    launch_ranks(rank_spec(3), fake_rank, env=env_for("ok"), on_records=got.extend, poll_s=0.05)
    assert sorted(r.rank for r in got) == [0, 1, 2]


def test_launcher_fails_with_the_crashed_ranks_output_and_keeps_what_was_spooled(fake_rank: Path,
                                                                               forks: Zygote | None) -> None:
    got: list[Any] = []
    with pytest.raises(RankFailed, match=r"rank 1 exited with code 3(.|\n)*rank 1 says goodbye"):
        launch_ranks(rank_spec(2), fake_rank, forks=forks, env=env_for("crash"), on_records=got.extend,
                     poll_s=0.05)
    assert 1 in {r.rank for r in got}


def test_launcher_names_every_rank_that_exited_when_several_failed(fake_rank: Path) -> None:
    # Which failed rank a poll sees first is a race: naming only the first could blame a peer of the cause.
    with pytest.raises(RankFailed) as failed:
        launch_ranks(rank_spec(2), fake_rank, env=env_for("crash-all"), on_records=lambda _: None,
                     poll_s=0.05)
    message = str(failed.value)
    assert "rank 0 exited with code 1; rank 1 exited with code 3" in message
    assert "rank 0 fails too" in message and "rank 1 fails too" in message


def test_launcher_kills_ranks_that_make_no_progress(fake_rank: Path, forks: Zygote | None) -> None:
    got: list[Any] = []
    with pytest.raises(RanksTimedOut, match=r"no progress from any rank \(0, 1\) for 4 s(.|\n)*rank 0 waits in"):
        launch_ranks(rank_spec(2), fake_rank, forks=forks, env=env_for("hang"), on_records=got.extend,
                     hang_timeout_s=4.0, poll_s=0.05)
    assert len(got) == 2  # the records written before the hang were handed on


def test_launcher_names_the_one_rank_that_stopped_while_the_others_stepped(fake_rank: Path) -> None:
    got: list[Any] = []
    started = time.monotonic()
    with pytest.raises(RanksTimedOut, match=r"rank 1 made no progress for 2 s while ranks 0, 2 did"
                                            r"(.|\n)*rank 1 waits in allreduce"):
        launch_ranks(rank_spec(3), fake_rank, env=env_for("stall-1"), on_records=got.extend,
                     hang_timeout_s=2.0, poll_s=0.05)
    assert time.monotonic() - started < 6  # the others were still stepping: caught before they finished


def test_launcher_gives_the_first_step_its_own_longer_timeout(fake_rank: Path) -> None:
    got: list[Any] = []
    launch_ranks(rank_spec(2), fake_rank, env=env_for("slow-first-step"), on_records=got.extend,
                 hang_timeout_s=1.0, first_step_timeout_s=10.0, poll_s=0.05)
    assert sorted(r.rank for r in got) == [0, 1]


def survivors(pids: list[int], within_s: float = 5.0) -> list[int]:
    """The processes still running after `within_s` (a SIGKILL lands a moment after it is sent)."""
    deadline = time.monotonic() + within_s
    while (left := [pid for pid in pids if running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def spawned(folder: Path, world: int) -> list[int]:
    return [int((folder / f"child{rank}.pid").read_text()) for rank in range(world)
            if (folder / f"child{rank}.pid").exists()]


def test_a_stop_kills_the_ranks_and_what_they_spawned_at_once(fake_rank: Path, forks: Zygote | None) -> None:
    got: list[Any] = []
    ranks: list[int] = []

    def stop() -> str | None:
        if len(spawned(fake_rank, 2)) < 2:
            return None
        ranks.extend(parent(child) for child in spawned(fake_rank, 2))
        return "run 7 is cancelled"

    started = time.monotonic()
    with pytest.raises(RanksStopped, match="run 7 is cancelled"):
        launch_ranks(rank_spec(2), fake_rank, forks=forks, env=env_for("spawn-and-wait"), on_records=got.extend,
                     poll_s=0.05, stop=stop)
    assert time.monotonic() - started < 30  # the ranks sleep 60 s
    assert len(ranks) == 2 and survivors(ranks + spawned(fake_rank, 2)) == []
    assert sorted(r.rank for r in got) == [0, 1]  # what was handed on before the stop stays handed on


def test_a_rank_that_exits_0_leaves_nothing_running(fake_rank: Path, forks: Zygote | None) -> None:
    launch_ranks(rank_spec(2), fake_rank, forks=forks, env=env_for("spawn"), on_records=lambda records: None,
                 poll_s=0.05)
    children = spawned(fake_rank, 2)
    assert len(children) == 2 and survivors(children) == []


def test_the_capacity_a_cpu_worker_reports_is_its_cores_times_ranks_per_core() -> None:
    capacity = launch.node_capacity("cpu", 3)
    assert capacity.device == "cpu" and capacity.cpu_cores == len(os.sched_getaffinity(0))
    assert capacity.max_world_size == 3 * capacity.cpu_cores


def test_launcher_refuses_a_bad_environment_before_starting_any_rank(fake_rank: Path) -> None:
    spec = run_spec(LD_PRELOAD="/tmp/x.so")
    with pytest.raises(ValueError, match="LD_PRELOAD"):
        launch_ranks(RankSpec.for_run(spec), fake_rank, env=lambda rank: child_env(spec, rank, fake_rank),
                     on_records=lambda records: None)
    assert list(fake_rank.glob("rank*.stderr")) == []


# ---- the runner against a stub ingest client --------------------------------------------------------

class StubClient:
    def __init__(self, reply: RunSpec | Exception) -> None:
        self.reply, self.finished, self.batches = reply, [], []  # type: ignore[var-annotated]

    def claim(self, run_id: int, worker: str) -> RunSpec:
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply

    def records(self, run_id: int, attempt: int, records: list[Any]) -> None:
        self.batches.append(records)

    def comm_log(self, *args: Any) -> None:
        pass

    def finish(self, run_id: int, attempt: int, status: str, error: str | None = None) -> None:
        self.finished.append((attempt, status, error))


def test_a_run_whose_env_is_refused_fails_with_the_reason(tmp_path: Path) -> None:
    client = StubClient(run_spec(LD_PRELOAD="/tmp/x.so"))
    assert runner.execute(1, client=client, worker="w") == "failed"  # type: ignore[arg-type]
    [(attempt, status, error)] = client.finished
    assert (attempt, status) == (1, "failed") and "LD_PRELOAD is not an allowed variable" in (error or "")


def test_a_claim_reply_that_is_no_spec_fails_that_attempt() -> None:
    client = StubClient(BadSpec("the claim reply is not a runnable spec: steps: Input should be ...", attempt=4))
    assert runner.execute(1, client=client, worker="w") == "failed"  # type: ignore[arg-type]
    assert client.finished == [(4, "failed", "worker error: the claim reply is not a runnable spec: "
                                             "steps: Input should be ...")]


def test_spool_folders_of_dead_workers_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no process has now: the worker that made the folder was killed
    dead, live = tmp_path / "detlab-run5-killed", tmp_path / "detlab-run6-running"
    for folder, pid in ((dead, gone.pid), (live, os.getpid())):
        folder.mkdir()
        (folder / runner.OWNER_FILE).write_text(str(pid))
        (folder / "rank0.jsonl").write_text("{}\n")
    assert runner.remove_dead_spools(tmp_path) == [dead]
    assert not dead.exists() and live.exists()


def test_a_run_spools_into_a_folder_naming_its_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def launch(spec: Any, folder: Path, **_: Any) -> None:
        seen.append((folder / runner.OWNER_FILE).read_text())

    monkeypatch.setattr(runner, "launch_ranks", launch)
    monkeypatch.setattr(runner, "upload_logs", lambda *args: None)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert runner._launch_and_stream(run_spec(), None, "cpu", 1.0, None) == ("succeeded", None)  # type: ignore[arg-type]
    assert seen == [str(os.getpid())]
