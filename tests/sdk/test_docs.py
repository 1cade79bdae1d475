"""Every example in docs/sdk.md runs as written: the blocks that start with `# <file name>` are saved
under that name in a fresh directory and run there, with this environment's python, torchrun and detlab."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from detlab.sdk import load_run
from tests.conftest import ROOT
from tests.ranks import rank_env, run_ranks

pytestmark = pytest.mark.timeout(900)  # each example may run for minutes (run() aborts a call past 300 s)

DOC = ROOT / "docs" / "sdk.md"
BLOCK = re.compile(r"```(?:python|bash)\n# ([\w.-]+)[^\n]*\n(.*?)```", re.S)


def examples() -> dict[str, str]:
    found = {name: f"# {name}\n{body}" for name, body in BLOCK.findall(DOC.read_text())}
    assert set(found) == {"train.py", "train_options.py", "train_ddp.py", "ddp.sh", "train_fsdp.py", "fsdp.sh",
                          "replicas.sh", "train_lightning.py", "train_hf.py", "ci.sh", "audit_step.py",
                          "invariance.py", "train_resume.py", "resume.sh"}
    return found


def save(workdir: Path) -> Path:
    for name, code in examples().items():
        (workdir / name).write_text(code)
    return workdir


def run(workdir: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    bin_dir = str(Path(sys.executable).parent)  # python, torchrun and detlab of this environment
    env = rank_env()
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return run_ranks(argv, env=env, cwd=workdir, limit_s=300)


def test_the_ci_gate_passes_on_two_runs_of_the_plain_loop(tmp_path: Path) -> None:
    done = run(save(tmp_path), "bash", "ci.sh")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "identical: 20 steps x 1 rank(s) x 4 tensors equal"


def test_the_ci_gate_fails_when_the_second_run_differs(tmp_path: Path) -> None:
    train = save(tmp_path) / "train.py"
    assert "torch.manual_seed(0)" in train.read_text()
    train.write_text(train.read_text().replace("torch.manual_seed(0)", "torch.manual_seed(sys.argv[1] == 'runs/b')"))
    done = run(tmp_path, "bash", "ci.sh")
    assert done.returncode == 1
    assert done.stdout.startswith("diverged at step 0 on rank(s) 0: 0.weight, 0.bias, 2.weight, 2.bias;")


def test_the_audit_example_checks_its_step_and_calls_no_draw_nondeterministic(tmp_path: Path) -> None:
    done = run(save(tmp_path), "python", "audit_step.py")
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.fullmatch(r"\d+ ops checked on cpu; nondeterministic: none\n", done.stdout), done.stdout


def test_the_batch_invariance_example_names_the_module_that_mixes_samples(tmp_path: Path) -> None:
    done = run(save(tmp_path), "python", "invariance.py")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "invariant: False; breaks at batch 2 in module 1\n"


def test_the_resume_example_is_exact(tmp_path: Path) -> None:
    done = run(save(tmp_path), "bash", "resume.sh")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines() == ["identical: 20 steps x 1 rank(s) x 16 tensors equal",
                                                "  resume of run 2 at step 9: exact"]


def test_the_resume_example_without_its_rng_restore_names_the_rng(tmp_path: Path) -> None:
    train = save(tmp_path) / "train_resume.py"
    train.write_text(train.read_text().replace('    torch.set_rng_state(saved["rng"])\n', ""))
    done = run(tmp_path, "bash", "resume.sh")
    assert done.returncode == 1
    assert done.stdout.splitlines()[:3] == [
        "diverged at step 9 on rank(s) 0: no tensor, the rng; 11 of 20 compared steps differ",
        "  first divergent component: rng: torch cpu", "  resume of run 2 at step 9: not exact (rng: torch cpu)"]


def test_the_options_example_records_what_its_options_name(tmp_path: Path) -> None:
    done = run(save(tmp_path), "python", "train_options.py", "runs/a")
    assert done.returncode == 0, done.stderr[-2000:]
    recorded = load_run(tmp_path / "runs" / "a")
    assert recorded.steps() == [0, 5, 10, 15]
    assert [name for name, _, _ in recorded.tensors] == [
        "0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var", "1.num_batches_tracked",
        "0.weight.exp_avg", "0.weight.exp_avg_sq", "0.weight.step", "0.bias.exp_avg", "0.bias.exp_avg_sq",
        "0.bias.step", "1.weight.exp_avg", "1.weight.exp_avg_sq", "1.weight.step", "1.bias.exp_avg",
        "1.bias.exp_avg_sq", "1.bias.step", "0.weight.grad", "0.bias.grad", "1.weight.grad", "1.bias.grad"]
    manifest = json.loads((tmp_path / "runs" / "a" / "run.json").read_text())
    assert (manifest["name"], manifest["tags"], manifest["every"]) == ("options", ["docs"], 5)


@pytest.fixture(scope="module")
def ddp_example(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The torchrun example's two runs (`ddp.sh`), made once for the tests that read them: its folder and output."""
    workdir = save(tmp_path_factory.mktemp("ddp"))
    return workdir, run(workdir, "bash", "ddp.sh")


def test_the_torchrun_example_gives_identical_runs_of_two_ranks(
        ddp_example: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    workdir, done = ddp_example
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "identical: 20 steps x 2 rank(s) x 4 tensors equal"
    assert sorted(p.name for p in (workdir / "runs" / "ddp-a").iterdir()) == ["rank0.jsonl", "rank1.jsonl", "run.json"]


def test_the_replica_check_of_the_torchrun_example_finds_its_replicas_equal(
        ddp_example: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    workdir, done = ddp_example
    assert done.returncode == 0, done.stderr[-2000:]
    done = run(workdir, "bash", "replicas.sh")
    assert (done.returncode, done.stdout.strip()) == (
        0, "replicas agree: 20 steps x 4 replicated tensors equal on every rank that holds them")


def test_the_fsdp2_example_gives_identical_runs_shard_by_shard(tmp_path: Path) -> None:
    done = run(save(tmp_path), "bash", "fsdp.sh")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "identical: 20 steps x 2 rank(s) x 16 tensors equal"
    shards = load_run(tmp_path / "runs" / "fsdp-a").rank_tensors
    assert [t.shape for t in shards[0][:4]] == [[16, 8], [16], [1, 32], [1]]
    assert [t.shape for t in shards[1][:4]] == [[16, 8], [16], [0, 32], [0]]


def test_two_runs_of_the_lightning_example_are_identical_with_steps_numbered_from_1(tmp_path: Path) -> None:
    for out in ("runs/a", "runs/b"):
        done = run(save(tmp_path), "python", "train_lightning.py", out)
        assert done.returncode == 0, done.stderr[-2000:]
    done = run(tmp_path, "detlab", "compare", "runs/a", "runs/b")
    assert (done.returncode, done.stdout.strip()) == (0, "identical: 20 steps x 1 rank(s) x 8 tensors equal")
    assert load_run(tmp_path / "runs" / "a").steps() == list(range(1, 21))


def test_two_runs_of_the_hf_trainer_example_are_identical_with_steps_numbered_from_1(tmp_path: Path) -> None:
    for out in ("runs/a", "runs/b"):
        done = run(save(tmp_path), "python", "train_hf.py", out)
        assert done.returncode == 0, done.stderr[-2000:]
    done = run(tmp_path, "detlab", "compare", "runs/a", "runs/b")
    assert (done.returncode, done.stdout.strip()) == (0, "identical: 20 steps x 1 rank(s) x 32 tensors equal")
    assert load_run(tmp_path / "runs" / "a").steps() == list(range(1, 21))
