"""`detlab compare A B` on runs of a plain-PyTorch script (tests/sdk/scripts/train.py, which uses only
what docs/sdk.md shows), in one process and as two ranks under torchrun (gloo, DDP), on CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.ranks import launcher, rank_env, run_ranks

SCRIPT = Path(__file__).resolve().parent / "scripts" / "train.py"


def record(out: Path, *args: str, ranks: int = 1, flip: str | None = None) -> Path:
    """Run the script into `out`; `flip` = STEP:RANK:TENSOR moves one element of TENSOR by one ulp."""
    env = rank_env()
    if flip:
        env["DETLAB_TEST_FLIP"] = flip
    done = run_ranks([*launcher(ranks), str(SCRIPT), str(out), *args], env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def compare(a: Path, b: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "detlab.cli", "compare", str(a), str(b), *options],
                          capture_output=True, text=True, timeout=120)


def verdict(a: Path, b: Path) -> tuple[int, dict[str, Any]]:
    done = compare(a, b, "--json")
    return done.returncode, json.loads(done.stdout)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record(tmp_path_factory.mktemp("one") / "a")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record(tmp_path_factory.mktemp("ddp") / "a", "--grads", "--buffers", "--optimizer-state", ranks=2)


@pytest.fixture(scope="module")
def desynced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As two_ranks, but rank 1's 0.weight moved by one ulp after step 2: a DDP replica out of step."""
    return record(tmp_path_factory.mktemp("desync") / "b", "--grads", "--buffers", "--optimizer-state", ranks=2,
                  flip="2:1:0.weight")


def test_two_runs_of_one_process_are_identical(one_process: Path, tmp_path: Path) -> None:
    done = compare(one_process, record(tmp_path / "b"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("identical: 6 steps x 1 rank(s) x 6 tensors equal")


def test_one_element_changed_in_one_process_names_step_tensor_and_rank(one_process: Path, tmp_path: Path) -> None:
    done = compare(one_process, record(tmp_path / "b", flip="3:0:3.bias"))
    assert done.returncode == 1
    assert done.stdout.startswith("diverged at step 3 on rank(s) 0: 3.bias;")


def test_two_torchrun_runs_of_two_ranks_are_identical(two_ranks: Path, tmp_path: Path) -> None:
    code, result = verdict(two_ranks, record(tmp_path / "b", "--grads", "--buffers", "--optimizer-state", ranks=2))
    assert (code, result["verdict"], result["mode"], result["missing"]) == (0, "identical", "per-rank", [])


def test_one_element_changed_on_rank_1_names_step_tensor_and_rank(two_ranks: Path, desynced: Path) -> None:
    code, result = verdict(two_ranks, desynced)
    assert code == 1
    assert {k: result[k] for k in ("verdict", "first_divergent_step", "first_divergent_tensors", "ranks")} == {
        "verdict": "diverged", "first_divergent_step": 2, "first_divergent_tensors": ["0.weight"], "ranks": [1]}
    # Adam's next update rounds this one-ulp change away on this data (as plain DDP does without detlab),
    # so only the step of the change differs: a check on parameters alone from step 3 on would miss it.
    assert (result["steps_differing"], result["a"]) == (1, str(two_ranks))


def test_the_replicas_of_a_ddp_run_agree(two_ranks: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "detlab.cli", "compare", str(two_ranks)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    # parameters, gradients and Adam's state: 6 x 5; BatchNorm's buffers follow each rank's own batch
    assert done.stdout == "replicas agree: 6 steps x 30 replicated tensors equal on every rank that holds them\n"


def test_a_ddp_rank_out_of_step_is_reported_as_replicas_disagreeing(two_ranks: Path, desynced: Path) -> None:
    done = compare(two_ranks, desynced)
    assert done.returncode == 1
    assert any(line.startswith("replicas disagree: run 2 step 2 tensor 0.weight ranks {0: ")
               for line in done.stdout.splitlines())
    [row] = verdict(two_ranks, desynced)[1]["replica_disagreements"]
    assert (row["run"], row["step"], row["tensor"], sorted(row["ranks"])) == (2, 2, "0.weight", ["0", "1"])


def test_replicas_that_disagree_fail_the_gate_though_the_runs_are_identical(desynced: Path) -> None:
    code, result = verdict(desynced, desynced)
    assert (code, result["verdict"]) == (1, "identical")
    assert [(row["run"], row["step"]) for row in result["replica_disagreements"]] == [(1, 2), (2, 2)]


def test_a_run_with_fewer_steps_is_incomplete_and_exits_2(one_process: Path, tmp_path: Path) -> None:
    done = compare(one_process, record(tmp_path / "b", "--steps", "4"))
    assert done.returncode == 2
    assert done.stdout.splitlines() == [
        "incomplete: the 4 steps both runs recorded are equal, but data is missing",
        "  missing: run 2 lacks 2 of 6 steps (4-5)",
        "  note: 2 recorded step(s) exist in one run only and were not compared"]


def test_runs_of_other_tensors_are_incomparable_and_exit_2(one_process: Path, tmp_path: Path) -> None:
    code, result = verdict(one_process, record(tmp_path / "b", "--names", "*.weight"))
    assert (code, result["verdict"]) == (2, "incomparable")
    assert "tensors present in one run only" in result["reason"]


def test_a_run_recorded_under_fp1_is_incomparable_with_an_fp2_run(one_process: Path, tmp_path: Path) -> None:
    """A recording made before fp2 (fp1 digests, as an older detlab wrote them) is recognised, never compared."""
    old = tmp_path / "old"
    old.mkdir()
    for f in one_process.iterdir():
        (old / f.name).write_text(f.read_text().replace('"fp2:', '"fp1:').replace('"fp_version":"fp2"',
                                                                                  '"fp_version":"fp1"'))
    assert '"fp1' in "".join(f.read_text() for f in old.iterdir())
    code, result = verdict(one_process, old)
    assert (code, result["verdict"]) == (2, "incomparable")
    assert result["reason"] == "fingerprint versions differ: ['fp2'] vs ['fp1']"


@pytest.mark.parametrize("make", [
    lambda root: root / "nowhere",
    lambda root: root,  # a directory, but no run.json
    lambda root: (root / "file").write_text("x") and root / "file",  # a file
])
def test_a_directory_that_is_not_a_recording_is_one_line_and_exit_2(one_process: Path, tmp_path: Path,
                                                                    make: Any) -> None:
    done = compare(one_process, make(tmp_path))
    assert done.returncode == 2
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"error: {tmp_path}")


def test_an_unreadable_rank_file_is_one_line_and_exit_2(one_process: Path, tmp_path: Path) -> None:
    broken = tmp_path / "b"
    broken.mkdir()
    (broken / "run.json").write_bytes((one_process / "run.json").read_bytes())
    (broken / "rank0.jsonl").mkdir()  # unreadable as a file, whoever runs the tests (root reads any file)
    done = compare(one_process, broken, "--json")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == f"error: {broken / 'rank0.jsonl'}: cannot read: Is a directory"
    assert json.loads(done.stdout)["verdict"] == "error"
