"""detlab.Recorder in one process on CPU: what it writes, each option, and the mistakes it refuses.

Every digest the recorder writes is checked against fingerprint_many called by the test itself at the
point the option promises (gradients before optimizer.step(), state after it)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import detlab
from detlab.sdk import load_run
from detlab.tensors.fingerprint import FP_VERSION, fingerprint_many


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def lines(out: Path, rank: int = 0) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()]


def step_digests(out: Path) -> dict[int, dict[str, str]]:
    """step -> {tensor name: digest} as the recorder wrote them."""
    records = lines(out)
    names = [t["name"] for t in next(r for r in records if r["type"] == "tensors")["tensors"]]
    return {r["step"]: {n: f"{FP_VERSION}:" + r["digests"][32 * i : 32 * (i + 1)] for i, n in enumerate(names)}
            for r in records if r["type"] == "step"}


def train(out: Path, steps: int = 4, *, before_step: Callable[..., None] | None = None,
          after_step: Callable[..., None] | None = None, use_grads: bool = False,
          after_grads: Callable[..., None] | None = None, **options: Any) -> dict[int, dict]:
    """A seeded Adam loop recording into `out`; returns what the test saw: step -> {name: digest} of
    parameters and buffers after optimizer.step(), gradients before it, optimizer state after it."""
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    seen: dict[int, dict] = {}
    with detlab.Recorder(out=out, optimizer=opt if options.pop("with_optimizer", False) else None,
                         grads=use_grads, **options) as rec:
        for step in range(steps):
            g = torch.Generator().manual_seed(step)
            x = torch.randn(16, 4, generator=g)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            opt.zero_grad()
            loss.backward()
            if before_step:
                before_step(step, model)
            grads = {f"{n}.grad": p.grad for n, p in model.named_parameters()}
            seen[step] = dict(zip(grads, fingerprint_many(list(grads.values())), strict=True))
            if use_grads:
                rec.grads(step, model)
            if after_grads:
                after_grads(step, model)
            opt.step()
            if after_step:
                after_step(step, model)
            state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
            names = {id(p): n for n, p in model.named_parameters()}
            state.update({f"{names[id(p)]}.{k}": v for p, s in opt.state.items() for k, v in s.items()})
            seen[step].update(zip(state, fingerprint_many([t.detach() for t in state.values()]), strict=True))
            rec.step(step, model, loss=loss)
    return seen


def test_writes_a_manifest_an_env_record_a_tensors_record_and_one_step_record_per_step(tmp_path: Path) -> None:
    seen = train(tmp_path / "a", steps=3, name="baseline", tags=["ci", "cpu"])
    manifest = json.loads((tmp_path / "a" / "run.json").read_text())
    assert (manifest["name"], manifest["tags"], manifest["world_size"]) == ("baseline", ["ci", "cpu"], 1)
    assert (manifest["fp_version"], manifest["status"]) == (FP_VERSION, "finished")
    kinds = [r["type"] for r in lines(tmp_path / "a")]
    assert kinds == ["env", "tensors", "step", "step", "step"]
    env = lines(tmp_path / "a")[0]
    assert env["torch"] == torch.__version__ and env["torch_flags"]["num_threads"] == torch.get_num_threads()
    recorded = step_digests(tmp_path / "a")
    assert list(recorded[0]) == ["0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"]
    for step, digests in recorded.items():
        assert digests == {n: seen[step][n] for n in digests}


def test_the_loss_is_recorded_by_its_float32_bits(tmp_path: Path) -> None:
    with detlab.Recorder(out=tmp_path / "a") as rec:
        rec.step(0, make_model(), loss=torch.tensor(0.1))
        rec.step(1, make_model(), loss=float("nan"))
        rec.step(2, make_model())
    steps = [r for r in lines(tmp_path / "a") if r["type"] == "step"]
    assert [(s["loss_bits"], s["loss"]) for s in steps] == [
        ("3dcccccd", pytest.approx(0.1)), ("7fc00000", None), ("", None)]


def test_every_records_the_multiples_of_n(tmp_path: Path) -> None:
    train(tmp_path / "a", steps=7, every=3)
    assert sorted(load_run(tmp_path / "a").steps()) == [0, 3, 6]


def sketched_steps(out: Path) -> list[int]:
    return [r["step"] for r in lines(out) if r["type"] == "step" and r["drift"]]


def test_drift_data_come_at_the_multiples_of_its_cadence_and_the_digests_at_every_step(tmp_path: Path) -> None:
    for name, drift in (("default", None), ("three", 3), ("every", True), ("none", False)):
        train(tmp_path / name, steps=12, use_grads=True, **({} if drift is None else {"drift": drift}))
    assert sketched_steps(tmp_path / "default") == [0, 10]  # detlab.sdk.recorder.DRIFT_EVERY
    assert sketched_steps(tmp_path / "three") == [0, 3, 6, 9]
    assert sketched_steps(tmp_path / "every") == list(range(12))
    assert sketched_steps(tmp_path / "none") == []
    digests = step_digests(tmp_path / "every")
    assert len(digests) == 12 and all(step_digests(tmp_path / n) == digests for n in ("default", "three", "none"))
    # A sketched step's statistics cover the gradients as well: three float64 per recorded tensor.
    tensors = next(r for r in lines(tmp_path / "three") if r["type"] == "tensors")["tensors"]
    assert any(t["name"].endswith(".grad") for t in tensors)
    assert all(len(r["drift"]["stats"]) == 48 * len(tensors) for r in lines(tmp_path / "three") if r.get("drift"))


def test_a_script_run_by_a_job_sketches_every_recorded_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DETLAB_RUN_DIR", str(tmp_path / "job"))  # as the worker sets it (worker/runner.py, script_env)
    train(tmp_path / "mine", steps=3)
    assert sketched_steps(tmp_path / "job") == [0, 1, 2]


@pytest.mark.parametrize("drift", [-1, 2.5, "10", None])
def test_a_drift_cadence_that_is_not_a_whole_number_of_steps_is_refused(tmp_path: Path, drift: Any) -> None:
    with pytest.raises(ValueError, match="drift takes True, False or a whole number of steps >= 0"):
        detlab.Recorder(out=tmp_path, drift=drift)


def test_a_glob_filter_keeps_the_matching_tensors(tmp_path: Path) -> None:
    train(tmp_path / "a", names="*.weight", buffers=True)
    assert list(step_digests(tmp_path / "a")[0]) == ["0.weight", "1.weight", "3.weight"]


def test_a_predicate_filter_keeps_the_tensors_it_accepts(tmp_path: Path) -> None:
    train(tmp_path / "a", names=lambda name: name.startswith("3."))
    assert list(step_digests(tmp_path / "a")[0]) == ["3.weight", "3.bias"]


def test_buffers_are_recorded_with_their_names(tmp_path: Path) -> None:
    seen = train(tmp_path / "a", buffers=True)
    recorded = step_digests(tmp_path / "a")
    assert {"1.running_mean", "1.running_var", "1.num_batches_tracked"} <= set(recorded[0])
    assert all(recorded[s]["1.running_mean"] == seen[s]["1.running_mean"] for s in recorded)


def test_optimizer_state_is_recorded_after_the_step(tmp_path: Path) -> None:
    seen = train(tmp_path / "a", with_optimizer=True)
    recorded = step_digests(tmp_path / "a")
    assert {"0.weight.exp_avg", "0.weight.exp_avg_sq", "0.weight.step"} <= set(recorded[0])
    assert all(recorded[s][n] == seen[s][n] for s in recorded for n in recorded[s])


def test_grads_are_the_gradients_as_they_were_at_rec_grads(tmp_path: Path) -> None:
    def clip(step: int, model: torch.nn.Module) -> None:  # changes the gradients in place after rec.grads()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e-3)

    seen = train(tmp_path / "a", use_grads=True, after_grads=clip)
    recorded = step_digests(tmp_path / "a")
    assert "3.weight.grad" in recorded[0]
    assert all(recorded[s][n] == seen[s][n] for s in recorded for n in recorded[s])


def test_a_gradient_changed_before_the_step_is_named_even_where_adam_hides_it(tmp_path: Path) -> None:
    def nudge(step: int, model: torch.nn.Module) -> None:
        if step == 2:
            with torch.no_grad():
                model[3].bias.grad.mul_(1 + 2**-20)

    train(tmp_path / "a", use_grads=True)
    train(tmp_path / "b", use_grads=True, before_step=nudge)
    result = detlab_compare(tmp_path / "a", tmp_path / "b")
    assert result["first_divergent_step"] == 2
    assert "3.bias.grad" in result["first_divergent_tensors"]


def detlab_compare(a: Path, b: Path) -> dict[str, Any]:
    from detlab.core.compare import compare_runs

    return compare_runs(load_run(a, 1), load_run(b, 2)).stored()


def test_a_parameter_changed_after_a_step_is_found_at_that_step(tmp_path: Path) -> None:
    def nudge(step: int, model: torch.nn.Module) -> None:
        if step == 1:
            with torch.no_grad():
                model[0].weight.view(-1)[3] += 1e-3

    train(tmp_path / "a")
    train(tmp_path / "b", after_step=nudge)
    result = detlab_compare(tmp_path / "a", tmp_path / "b")
    assert (result["verdict"], result["first_divergent_step"], result["first_divergent_tensors"]) == (
        "diverged", 1, ["0.weight"])


def test_grads_true_without_rec_grads_is_refused_with_what_to_call(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"call rec.grads\(0, model\) after loss.backward\(\)"):
        with detlab.Recorder(out=tmp_path / "a", grads=True) as rec:
            rec.step(0, make_model())
    assert json.loads((tmp_path / "a" / "run.json").read_text())["status"] == "failed"


def test_a_tensor_list_that_changes_is_refused(tmp_path: Path) -> None:
    model = make_model()
    opt = torch.optim.Adam(model.parameters())
    rec = detlab.Recorder(out=tmp_path / "a", optimizer=opt)
    rec.step(0, model)  # before the first optimizer.step(): no state yet
    model(torch.randn(4, 4)).sum().backward()
    opt.step()
    with pytest.raises(ValueError, match="the recorded tensors changed at step 1.*record after it"):
        rec.step(1, model)
    assert json.loads((tmp_path / "a" / "run.json").read_text())["status"] == "failed"  # no close() needed
    rec.close()


def test_an_unchanged_tensor_list_is_checked_once_and_a_reshaped_tensor_at_once(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's per-step work is built once: the list is checked at the first step alone while nothing changes;
    a parameter given another shape over the same storage (same address) is still caught at its step."""
    checked: list[int] = []
    check = detlab.Recorder._check_tensors
    monkeypatch.setattr(detlab.Recorder, "_check_tensors",
                        lambda self, step, *rest: (checked.append(step), check(self, step, *rest))[1])
    model = make_model()
    rec = detlab.Recorder(out=tmp_path / "a")
    for step in range(4):
        rec.step(step, model)
    assert checked == [0]
    weight = model[0].weight
    before = weight.data_ptr()
    weight.data = weight.data.view(4, 8)
    assert weight.data_ptr() == before
    with pytest.raises(ValueError, match=r"changed at step 4.*other shape or dtype: \['0.weight'\]"):
        rec.step(4, model)
    assert checked == [0, 4]
    rec.close()


@pytest.mark.parametrize("where", ["buffer", "gradient"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
def test_a_sparse_tensor_is_refused_at_the_call_with_what_to_do(tmp_path: Path, device: str, where: str) -> None:
    """On the CPU it raised torch's own "nbytes is not defined for sparse tensors" (the snapshot's size was summed
    before its tensors were checked), then "Cannot access data pointer" (a ListKey made of it); on CUDA, a sparse
    buffer or an embedding's sparse gradient still raised the latter."""
    model = torch.nn.Sequential(torch.nn.Embedding(8, 4, sparse=True), torch.nn.Linear(4, 1)).to(device)
    model.register_buffer("adjacency", torch.eye(3, device=device).to_sparse())
    with detlab.Recorder(out=tmp_path / "a", buffers=where == "buffer", grads=where == "gradient") as rec:
        with pytest.raises(TypeError, match=r"sparse_coo tensor .* call .to_dense\(\) first"):
            if where == "buffer":
                rec.step(0, model)
            else:
                model(torch.arange(3, device=device)).sum().backward()
                rec.grads(0, model)


def test_a_replaced_parameter_is_fingerprinted_not_its_predecessor(tmp_path: Path) -> None:
    model = make_model()
    with detlab.Recorder(out=tmp_path / "a") as rec:
        rec.step(0, model)
        model[3].bias = torch.nn.Parameter(torch.full((1,), 7.0))
        rec.step(1, model)
    assert step_digests(tmp_path / "a")[1]["3.bias"] == fingerprint_many([torch.full((1,), 7.0)])[0]


def test_a_directory_that_holds_a_recording_is_refused_unless_overwrite(tmp_path: Path) -> None:
    train(tmp_path / "a", steps=2)
    with pytest.raises(FileExistsError, match="already holds a recording.*overwrite=True"):
        train(tmp_path / "a", steps=2)
    train(tmp_path / "a", steps=3, overwrite=True)
    assert sorted(load_run(tmp_path / "a").steps()) == [0, 1, 2]


def test_a_directory_that_holds_a_recording_is_refused_when_the_recorder_is_made(tmp_path: Path) -> None:
    train(tmp_path / "a", steps=2)
    with pytest.raises(FileExistsError, match="already holds a recording.*overwrite=True"):
        detlab.Recorder(out=tmp_path / "a")  # not at the first rec.step, after the model was built
    detlab.Recorder(out=tmp_path / "a", overwrite=True).close()


def test_a_per_epoch_batch_index_is_refused_at_its_first_repeat_with_what_to_pass_and_the_run_fails(
        tmp_path: Path) -> None:
    model, rec = make_model(), detlab.Recorder(out=tmp_path / "a")
    for batch_idx in range(10):  # epoch 1
        rec.step(batch_idx, model)
    with pytest.raises(ValueError, match=r"rec.step\(0\) after step 9.*global step counter"):
        rec.step(0, model)  # epoch 2's first batch
    # no close(), no `with`: the script dies here, and the recording says so
    assert json.loads((tmp_path / "a" / "run.json").read_text())["status"] == "failed"
    assert sorted(load_run(tmp_path / "a").steps()) == list(range(10))


def test_steps_must_increase(tmp_path: Path) -> None:
    with detlab.Recorder(out=tmp_path / "a") as rec:
        rec.step(3, make_model())
        with pytest.raises(ValueError, match="step numbers must increase"):
            rec.step(3, make_model())


def test_a_closed_recorder_refuses_more_steps(tmp_path: Path) -> None:
    rec = detlab.Recorder(out=tmp_path / "a")
    rec.close()
    with pytest.raises(RuntimeError, match="closed"):
        rec.step(0, make_model())


@pytest.mark.parametrize(("options", "error", "fragment"), [
    ({}, TypeError, "out=DIR"),
    ({"server": "detlab.example:8000"}, ValueError, "the detlab server's URL"),
    ({"out": "x", "tags": ["no spaces"]}, ValueError, "tags"),
])
def test_a_recorder_it_cannot_run_is_refused_when_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       options: dict, error: type, fragment: str) -> None:
    monkeypatch.delenv("DETLAB_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error, match=fragment):
        detlab.Recorder(**options)


def test_ranks_come_from_the_torchrun_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with detlab.Recorder(out=tmp_path / "a") as rec:
        rec.step(0, make_model())
    assert (tmp_path / "a" / "rank3.jsonl").exists() and not (tmp_path / "a" / "run.json").exists()
    assert lines(tmp_path / "a", 3)[0]["rank"] == 3


def test_warn_only_is_found_at_the_start_warned_recorded_and_training_goes_on(tmp_path: Path) -> None:
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with pytest.warns(RuntimeWarning, match=r"detlab preflight \(deterministic-warn-only\)"):
            train(tmp_path / "a", steps=2)
    finally:
        torch.use_deterministic_algorithms(False)
    env = lines(tmp_path / "a")[0]
    assert [f["rule"] for f in env["preflight"]] == ["deterministic-warn-only"]
    assert env["preflight"][0]["fix"].startswith("torch.use_deterministic_algorithms(True)")
    assert [r["type"] for r in lines(tmp_path / "a")].count("step") == 2  # recorded, not stopped


def test_a_clean_process_records_an_empty_preflight(tmp_path: Path) -> None:
    train(tmp_path / "a", steps=1)
    assert lines(tmp_path / "a")[0]["preflight"] == []  # checked, nothing found (None would be: not checked)


# ---- on the CPU, digests and drift come from a snapshot, on the writer thread --------------------------------


def records_but_time(out: Path) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in ("step_time_s", "started", "finished")}
            for r in lines(out) if r["type"] in ("tensors", "step")]


def test_records_from_the_writer_thread_equal_those_made_at_the_call(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def scribble(step: int, model: torch.nn.Module) -> None:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(0.5)  # after rec.grads: the snapshot must not see it

    options = {"use_grads": True, "with_optimizer": True, "buffers": True, "after_grads": scribble, "drift": True}
    train(tmp_path / "later", steps=5, **options)
    monkeypatch.setenv("DETLAB_CPU_DEFER", "0")  # the old path: digests and sketches at the call
    train(tmp_path / "now", steps=5, **options)
    later, now = records_but_time(tmp_path / "later"), records_but_time(tmp_path / "now")
    assert len(later) == 6 and all(r["drift"] for r in later if r["type"] == "step")
    assert later == now


def test_steps_left_on_the_writer_reach_the_file_when_the_script_never_closes(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, torch, detlab\n"
        "model = torch.nn.Linear(256, 256)\n"
        "rec = detlab.Recorder(out=sys.argv[1])\n"
        "for step in range(30):\n"
        "    with torch.no_grad():\n"
        "        model.weight.add_(1.0)\n"
        "    rec.step(step, model)\n")  # and exits: no close()
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "a")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert load_run(tmp_path / "a").steps() == list(range(30))
