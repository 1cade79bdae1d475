"""The framework callbacks with the real frameworks on CPU: Lightning (tests/sdk/scripts/train_lightning.py,
one process and two ranks under torchrun over gloo) and the Hugging Face Trainer (scripts/train_hf.py, a
one-layer GPT-2 built from its config). Two runs compare identical under `detlab compare`; one element
changed by a callback at a chosen step is named with that step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from detlab.core.compare import compare_runs
from detlab.sdk import load_run
from tests.ranks import launcher, run_ranks
from tests.sdk.test_compare import compare, verdict

pytestmark = pytest.mark.timeout(600)  # two trainer runs, each aborted past 180 s (tests/ranks.py)

SCRIPTS = Path(__file__).resolve().parent / "scripts"
LIGHTNING, HF = SCRIPTS / "train_lightning.py", SCRIPTS / "train_hf.py"
RECORD_ALL = ("--grads", "--optimizer-state")


def train(script: Path, out: Path, *args: str, ranks: int = 1) -> subprocess.CompletedProcess[str]:
    return run_ranks([*launcher(ranks), str(script), str(out), *args])


def record(script: Path, out: Path, *args: str, ranks: int = 1) -> Path:
    done = train(script, out, *args, ranks=ranks)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def lightning_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record(LIGHTNING, tmp_path_factory.mktemp("lightning") / "a", *RECORD_ALL)


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record(HF, tmp_path_factory.mktemp("hf") / "a", *RECORD_ALL)


def test_importing_the_integrations_package_loads_no_framework() -> None:
    probe = ("import sys, detlab.integrations, detlab.integrations.recording; "
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'lightning', 'pytorch_lightning', "
             "'transformers'}))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd="/", timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


# ---- Lightning ---------------------------------------------------------------------------------------


def test_a_lightning_recording_numbers_steps_as_global_step_with_loss_gradients_and_state(
        lightning_run: Path) -> None:
    recorded = load_run(lightning_run)
    assert recorded.steps() == [1, 2, 3, 4, 5, 6]
    assert all(recorded.records[(step, 0)].loss is not None for step in recorded.steps())
    names = [name for name, _, _ in recorded.tensors]
    assert names[:4] == ["net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"]
    assert {"net.0.weight.exp_avg", "net.0.weight.grad"} <= set(names)


def test_two_lightning_runs_are_identical(lightning_run: Path, tmp_path: Path) -> None:
    done = compare(lightning_run, record(LIGHTNING, tmp_path / "b", *RECORD_ALL))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("identical: 6 steps x 1 rank(s) x 20 tensors equal")


def test_one_element_changed_in_a_lightning_run_names_its_step_and_tensor(lightning_run: Path, tmp_path: Path) -> None:
    done = compare(lightning_run, record(LIGHTNING, tmp_path / "b", *RECORD_ALL, "--flip", "3:0:net.0.weight"))
    assert done.returncode == 1
    assert done.stdout.startswith("diverged at step 3 on rank(s) 0: net.0.weight;")


def test_a_lightning_resume_from_ckpt_path_is_exact_but_its_loader_starts_the_epoch_again(
        lightning_run: Path, tmp_path: Path) -> None:
    """fit(ckpt_path=) restores model, optimizer and step; a plain DataLoader begins its epoch again (Lightning warns
    so): the recording continues, the restore is exact, and the batch is what parts first, at the next step."""
    resumed = record(LIGHTNING, tmp_path / "b", *RECORD_ALL, "--steps", "3", "--checkpoint")
    record(LIGHTNING, resumed, *RECORD_ALL, "--resume")
    result = compare_runs(load_run(lightning_run, 1), load_run(resumed, 2))
    assert result.resume is not None and (result.resume.step, result.resume.exact) == (3, True)
    assert result.first_divergent_step == 4 and result.first_divergent_component is not None
    assert result.first_divergent_component.component == "batch"


def test_the_callback_records_a_pytorch_lightning_trainer_alike(lightning_run: Path, tmp_path: Path) -> None:
    """The same class serves the older `pytorch_lightning` package's Trainer (Lightning calls hooks by name)."""
    done = compare(lightning_run, record(LIGHTNING, tmp_path / "b", *RECORD_ALL, "--package", "pytorch_lightning"))
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_lightning_run_that_raises_keeps_its_steps_and_is_marked_failed(tmp_path: Path) -> None:
    done = train(LIGHTNING, tmp_path / "a", "--raise-at", "2")
    assert done.returncode != 0 and "a failure the test asked for" in done.stderr
    assert load_run(tmp_path / "a").steps() == [1, 2]
    assert json.loads((tmp_path / "a" / "run.json").read_text())["status"] == "failed"


def test_two_lightning_ddp_runs_of_two_ranks_under_torchrun_are_identical(tmp_path: Path) -> None:
    a, b = (record(LIGHTNING, tmp_path / name, "--grads", ranks=2) for name in ("a", "b"))
    code, result = verdict(a, b)
    assert (code, result["verdict"], result["mode"], result["missing"]) == (0, "identical", "per-rank", [])
    assert sorted(p.name for p in a.iterdir()) == ["rank0.jsonl", "rank1.jsonl", "run.json"]


# ---- Hugging Face Trainer ------------------------------------------------------------------------------


def test_an_hf_recording_numbers_steps_as_global_step_with_loss_gradients_and_state(hf_run: Path) -> None:
    recorded = load_run(hf_run)
    assert recorded.steps() == [1, 2, 3, 4, 5, 6]
    assert all(recorded.records[(step, 0)].loss is not None for step in recorded.steps())
    names = {name for name, _, _ in recorded.tensors}
    assert {"transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_fc.weight.exp_avg",
            "transformer.h.0.mlp.c_fc.weight.grad"} <= names


def test_two_hf_trainer_runs_are_identical(hf_run: Path, tmp_path: Path) -> None:
    done = compare(hf_run, record(HF, tmp_path / "b", *RECORD_ALL))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("identical: 6 steps x 1 rank(s) x 80 tensors equal")


def test_one_element_changed_in_an_hf_trainer_run_names_its_step_and_tensor(hf_run: Path, tmp_path: Path) -> None:
    changed = record(HF, tmp_path / "b", *RECORD_ALL, "--flip", "2:transformer.h.0.mlp.c_fc.weight")
    done = compare(hf_run, changed)
    assert done.returncode == 1
    assert done.stdout.startswith("diverged at step 2 on rank(s) 0: transformer.h.0.mlp.c_fc.weight;")


def test_an_hf_resume_from_checkpoint_is_identical_and_exact(hf_run: Path, tmp_path: Path) -> None:
    resumed = record(HF, tmp_path / "b", *RECORD_ALL, "--stop-at", "3")
    record(HF, resumed, *RECORD_ALL, "--resume", "3")
    result = compare_runs(load_run(hf_run, 1), load_run(resumed, 2))
    assert result.verdict == "identical"
    assert result.resume is not None and (result.resume.step, result.resume.exact) == (3, True)


def test_with_gradient_accumulation_an_hf_step_is_one_optimizer_step_with_the_trainers_loss(tmp_path: Path) -> None:
    done = train(HF, tmp_path / "a", "--accumulate", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    recorded = load_run(tmp_path / "a")
    losses = [recorded.records[(step, 0)].loss or 0.0 for step in recorded.steps()]
    assert recorded.steps() == [1, 2, 3, 4, 5, 6]
    # GPT-2 divides by the step's token count (num_items_in_batch): each forward's loss is a share of the step's
    trainer_loss = json.loads(done.stdout.strip().splitlines()[-1])["training_loss"]
    assert sum(losses) / len(losses) == pytest.approx(trainer_loss, rel=1e-6)
