"""Recorder(rng=True, optimizer=..., resume=True) and rec.step(batch=...) in one process on CPU, and what `detlab
compare` says of a resume: exact when every part of the state is restored; otherwise the first component lost,
at the step where it shows. The "fresh process" is a new model, optimizer, scheduler and Recorder built from a
checkpoint in memory (the e2e test of the resume job kind runs real processes)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import detlab
from detlab.core.compare import compare_runs
from detlab.sdk.store import load_run

STEPS, STOP = 6, 2


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt, torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)


def data() -> torch.Tensor:
    return torch.arange(64, dtype=torch.float32).reshape(16, 4) / 64


def train_steps(rec: detlab.Recorder, parts: tuple[Any, ...], steps: range, position: int) -> None:
    model, opt, sched = parts
    samples = data()
    for step, i in zip(steps, range(position, position + len(steps)), strict=True):
        x = samples[i % 12: i % 12 + 4]
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        rec.step(step, model, loss=loss, batch={"x": x, "i": [x[0]]})


def record(out: Path, *, lose: str | None = None, stop: int | None = None) -> Path:
    """A run of STEPS steps into `out`; with `stop`, checkpointed after that step and continued from the checkpoint
    with the state `lose` names left out of the restore."""
    torch.manual_seed(0)
    parts = build()
    with detlab.Recorder(out=out, optimizer=parts[1], rng=True) as rec:
        train_steps(rec, parts, range((stop if stop is not None else STEPS - 1) + 1), 0)
    if stop is None:
        return out
    model, opt, sched = parts
    saved = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                           "rng": torch.get_rng_state()})
    torch.manual_seed(99)  # the new process's own state, where the restore leaves it
    model, opt, sched = parts = build()
    model.load_state_dict(saved["model"])
    if lose != "optimizer":
        opt.load_state_dict(saved["opt"])
    if lose != "scheduler":
        sched.load_state_dict(saved["sched"])
    if lose != "rng":
        torch.set_rng_state(saved["rng"])
    with detlab.Recorder(out=out, optimizer=opt, rng=True, resume=True) as rec:
        rec.step(stop, model)  # the restored state of the checkpoint's step
        train_steps(rec, parts, range(stop + 1, STEPS), 0 if lose == "data" else stop + 1)
    return out


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record(tmp_path_factory.mktemp("straight") / "a")


def test_a_full_restore_is_identical_and_exact(straight: Path, tmp_path: Path) -> None:
    result = compare_runs(load_run(straight, 1), load_run(record(tmp_path / "b", stop=STOP), 2))
    assert result.verdict == "identical"
    assert result.resume is not None and (result.resume.step, result.resume.exact) == (STOP, True)


@pytest.mark.parametrize(("lose", "step", "component", "exact", "entry"), [
    ("optimizer", STOP, "optimizer", False, "0.weight.exp_avg"),
    ("rng", STOP, "rng", False, "torch cpu"),
    ("data", STOP + 1, "batch", True, "x"),
    ("scheduler", STOP + 1, "optimizer", True, "param_groups[0].lr"),
])
def test_a_lost_component_is_named_at_its_step(straight: Path, tmp_path: Path, lose: str, step: int,
                                               component: str, exact: bool, entry: str) -> None:
    result = compare_runs(load_run(straight, 1), load_run(record(tmp_path / "b", lose=lose, stop=STOP), 2))
    assert (result.verdict, result.first_divergent_step) == ("diverged", step)
    first = result.first_divergent_component
    assert first is not None and first.component == component and entry in first.tensors
    assert result.resume is not None and result.resume.exact is exact
    assert (component in result.resume.components) is not exact


def test_the_recording_keeps_both_records_of_the_restored_step(tmp_path: Path) -> None:
    out = record(tmp_path / "b", stop=STOP)
    steps = [json.loads(line) for line in (out / "rank0.jsonl").read_text().splitlines()]
    at_stop = [(r["segment"], r["restored"]) for r in steps if r["type"] == "step" and r["step"] == STOP]
    assert at_stop == [(0, False), (1, True)]
    assert json.loads((out / "run.json").read_text())["status"] == "finished"


def test_a_batch_structure_is_fingerprinted_leaf_by_leaf(tmp_path: Path) -> None:
    out = record(tmp_path / "a")
    first = next(json.loads(line) for line in (out / "rank0.jsonl").read_text().splitlines() if '"step"' in line)
    assert set(first["state"]["batch"]) == {"x", "i[0]"}
    assert set(first["state"]["rng"]) >= {"torch cpu", "numpy", "python"}


def test_resume_without_a_recording_says_so(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no recording of rank 0 to continue"):
        detlab.Recorder(out=tmp_path / "none", resume=True)


def test_resume_and_overwrite_are_refused_together(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="pass one"):
        detlab.Recorder(out=tmp_path, resume=True, overwrite=True)


def test_resume_online_is_refused_with_what_to_do_instead(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="detlab upload"):
        detlab.Recorder(out=tmp_path, server="http://127.0.0.1:9", token="t" * 32, resume=True)


def test_rng_refuses_what_is_not_a_generator(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="rng= takes"):
        detlab.Recorder(out=tmp_path, rng=[object()])


def test_making_a_recorder_leaves_pythons_random_as_it_was(tmp_path: Path) -> None:
    """A fresh process imports the SDK at its first Recorder, after restoring `random`: the import must not draw."""
    code = ("import random, torch, detlab; random.seed(0); s = random.getstate(); "
            f"detlab.Recorder(out={str(tmp_path / 'r')!r}); assert random.getstate() == s")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
