"""The zygote (detlab.worker.zygote): a forked rank is its program run as `python -m` would run it, trains to the
bits of a fresh process, and dies with its launcher; a rank is forked only when its environment allows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from detlab.core.wire import RankSpec, StepRecord
from detlab.worker import launch
from detlab.worker.launch import launch_ranks
from detlab.worker.zygote import LAZY_ENV, READY_TIMEOUT_S, Zygote, ZygoteGone, only_lazy_differences
from tests.worker.test_runner import survivors

PROGRAM = """
import os, sys, time
if __name__ == "__main__":
    print("argv", sys.argv[1:], "cwd", os.getcwd(), "algo", os.environ.get("NCCL_ALGO"),
          "own session", os.getsid(0) == os.getpid(), "stdin empty", sys.stdin.read() == "", flush=True)
    print("to stderr", file=sys.stderr)
    how = sys.argv[1]
    if how == "exit-3":
        sys.exit(3)
    if how == "raise":
        raise ValueError("boom")
    if how == "sleep":
        time.sleep(60)
"""


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Zygote]:
    root = tmp_path_factory.mktemp("programs")
    (root / "zprogram.py").write_text(PROGRAM)
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    zygote = Zygote(["zprogram"], env={**os.environ, "PYTHONPATH": path})
    yield zygote
    zygote.close()


def test_a_forked_rank_is_its_program_run_as_main_with_its_argv_env_cwd_and_output(programs: Zygote,
                                                                                    tmp_path: Path) -> None:
    out = tmp_path / "rank0.stderr"
    rank = programs.fork("zprogram", ["ok"], {**programs.env, "NCCL_ALGO": "Tree"}, str(tmp_path), str(out))
    assert rank.wait() == 0
    text = out.read_text()
    assert f"argv ['ok'] cwd {tmp_path} algo Tree own session True stdin empty True" in text
    assert "to stderr" in text


@pytest.mark.parametrize(("how", "code", "said"), [("exit-3", 3, ""), ("raise", 1, "ValueError: boom")])
def test_a_forked_ranks_exit_code_is_the_one_python_gives(programs: Zygote, tmp_path: Path, how: str, code: int,
                                                          said: str) -> None:
    out = tmp_path / "out"
    assert programs.fork("zprogram", [how], programs.env, str(tmp_path), str(out)).wait() == code
    assert said in out.read_text()


def test_a_killed_forked_rank_exits_by_its_signal(programs: Zygote, tmp_path: Path) -> None:
    rank = programs.fork("zprogram", ["sleep"], programs.env, str(tmp_path), str(tmp_path / "out"))
    os.killpg(rank.pid, signal.SIGKILL)  # its own process group, as the launcher kills it
    assert rank.wait() == -signal.SIGKILL


def test_only_variables_read_after_start_up_may_differ_for_a_rank_to_be_forked() -> None:
    base = {"PATH": "/bin", "NCCL_ALGO": "Ring", "OMP_NUM_THREADS": "2"}
    assert only_lazy_differences(base, {**base, "RANK": "1", "NCCL_ALGO": "Tree", "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
                                        "OMP_NUM_THREADS": "1"})
    for changed in ({**base, "LD_PRELOAD": "x.so"}, {**base, "MKL_NUM_THREADS": "1"},
                    {**base, "TORCH_SHOW_CPP_STACKTRACES": "1"}, {"NCCL_ALGO": "Ring", "OMP_NUM_THREADS": "2"},
                    {**base, "PYTHONHASHSEED": "random"}):  # a config's own hash seed: a fresh process reads it
        assert not only_lazy_differences(base, changed)
    assert only_lazy_differences(base, {**base, "FAKE": "x"}, LAZY_ENV | {"FAKE"})


LAUNCHER = """
import sys, time
from detlab.worker.zygote import Zygote
zygote = Zygote(["zprogram"])
rank = zygote.fork("zprogram", ["sleep"], zygote.env, ".", sys.argv[1])
print(rank.pid, flush=True)
time.sleep(60)
"""


def test_forked_ranks_die_with_their_launcher_however_it_dies(programs: Zygote, tmp_path: Path) -> None:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path / "out")], env=programs.env,
                                stdout=subprocess.PIPE, text=True)
    assert launcher.stdout is not None
    pid = int(launcher.stdout.readline())
    launcher.kill()
    launcher.wait()
    assert survivors([pid], within_s=10) == []


def steps(records: list[object]) -> list[tuple[int, int, str, str, str]]:
    return sorted((r.step, r.rank, r.model_digest, r.digests, r.loss_bits) for r in records
                  if isinstance(r, StepRecord))


def test_ranks_forked_from_the_zygote_train_to_the_bits_of_fresh_processes(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    spec = RankSpec(kind="train", workload="mlp", world_size=2, steps=3, device="cpu", threads=1)
    zygote = Zygote(launch.PRELOADED)
    try:
        forked: list[object] = []
        (tmp_path / "forked").mkdir()
        launch_ranks(spec, tmp_path / "forked", on_records=forked.extend, timeout_s=120, forks=zygote)
        assert len(zygote.exits) == 2 and set(zygote.exits.values()) == {0}
    finally:
        zygote.close()
    monkeypatch.setenv("DETLAB_FORK_RANKS", "0")
    fresh: list[object] = []
    (tmp_path / "fresh").mkdir()
    launch_ranks(spec, tmp_path / "fresh", on_records=fresh.extend, timeout_s=120)
    assert len(steps(forked)) == 8 and steps(forked) == steps(fresh)


def test_a_worker_forks_its_ranks_from_one_zygote_and_starts_a_fresh_one_when_its_environment_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = RankSpec(kind="train", workload="mlp", world_size=1, steps=1, device="cpu")
    for n in range(2):
        (tmp_path / str(n)).mkdir()
        launch_ranks(spec, tmp_path / str(n), on_records=lambda _: None, timeout_s=120)
    first = launch.zygote.shared(launch.PRELOADED)
    assert first is not None and len(first.exits) >= 2
    monkeypatch.setenv("DETLAB_SOMETHING_NEW", "1")
    assert launch.zygote.shared(launch.PRELOADED) is not first and not first.alive()


def test_a_rank_that_cannot_be_set_up_exits_1_and_the_zygote_serves_on(programs: Zygote, tmp_path: Path) -> None:
    unwritable = tmp_path / "no-such-folder" / "out"
    assert programs.fork("zprogram", ["ok"], programs.env, str(tmp_path), str(unwritable)).wait() == 1
    assert programs.fork("zprogram", ["ok"], programs.env, str(tmp_path), str(tmp_path / "out")).wait() == 0


def test_a_zygote_that_cannot_load_is_refused_at_once() -> None:
    started = time.monotonic()
    with pytest.raises(ZygoteGone, match="did not load"):
        Zygote(["detlab_no_such_module"])
    assert time.monotonic() - started < READY_TIMEOUT_S / 2
