"""On CUDA: the recorder's asynchronous digests are those of the tensors as they were at the call, even when
the loop changes them in place right after it on a busy stream (run on a GPU machine; skipped elsewhere)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import detlab
from detlab.tensors.fingerprint import FP_VERSION, fingerprint_many

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("drift", [True, 2, False])  # every step one read; one-pass and the fingerprint's in turn
def test_async_digests_are_of_the_tensors_at_the_call(tmp_path: Path, drift: int) -> None:
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    busy = torch.randn(4096, 4096, device=dev)
    expected = {}
    with detlab.Recorder(out=tmp_path / "a", grads=True, optimizer=opt, drift=drift) as rec:
        for step in range(6):
            loss = model(torch.randn(64, 512, device=dev)).square().mean()
            opt.zero_grad()
            loss.backward()
            grads = [p.grad for p in model.parameters()]
            want_grads = fingerprint_many(grads)
            busy @ busy  # the stream is busy: the recorder's launch is still waiting when the next line runs
            rec.grads(step, model)
            for g in grads:
                g.mul_(0.5)  # queued after rec.grads: must not be seen
            opt.step()
            state = [*model.parameters(), *(v for p in model.parameters() for _, v in sorted(opt.state[p].items()))]
            expected[step] = fingerprint_many(state) + want_grads
            busy @ busy
            rec.step(step, model, loss=loss)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)  # queued after rec.step: must not be seen
    records = [json.loads(line) for line in (tmp_path / "a" / "rank0.jsonl").read_text().splitlines()]
    assert records[0]["fingerprint_impl"] == "triton"
    got = {r["step"]: [f"{FP_VERSION}:" + r["digests"][i : i + 32] for i in range(0, len(r["digests"]), 32)]
           for r in records if r["type"] == "step"}
    assert got == expected
    assert [r["step"] for r in records if r["type"] == "step" and r["drift"]] == (
        list(range(0, 6, drift)) if drift else [])


def test_a_parameter_transposed_in_place_is_read_as_its_values_after_the_plan_was_reused(tmp_path: Path) -> None:
    """The one-pass plan of an unchanged list is reused from step to step (its CUDA graph replayed); a square
    weight given transposed strides over the same storage is the same address, shape and dtype, and must not be
    read through the old plan as if it were still contiguous."""
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64).to(dev)
    expected = {}
    with detlab.Recorder(out=tmp_path / "a") as rec:
        for step in range(5):
            if step == 3:
                model.weight.data = model.weight.data.t()  # same storage, shape and dtype; other strides
                assert not model.weight.is_contiguous()
            expected[step] = fingerprint_many([model.weight, model.bias])
            rec.step(step, model)
    records = [json.loads(line) for line in (tmp_path / "a" / "rank0.jsonl").read_text().splitlines()]
    got = {r["step"]: [f"{FP_VERSION}:" + r["digests"][i : i + 32] for i in range(0, len(r["digests"]), 32)]
           for r in records if r["type"] == "step"}
    assert got == expected
    assert expected[3] != expected[2]


def test_a_loss_on_the_gpu_is_read_later_as_its_float32_bits_whatever_its_dtype_and_shape(tmp_path: Path) -> None:
    dev = torch.device("cuda", 0)
    model = torch.nn.Linear(4, 4).to(dev)
    losses = [torch.tensor(1.1, device=dev), torch.tensor([2.3], device=dev, dtype=torch.bfloat16),
              torch.tensor([[3.7]], device=dev, dtype=torch.float16, requires_grad=True) * 2]
    with detlab.Recorder(out=tmp_path / "a") as rec:
        for step, loss in enumerate(losses):
            rec.step(step, model, loss=loss)
    records = [json.loads(line) for line in (tmp_path / "a" / "rank0.jsonl").read_text().splitlines()]
    got = [r["loss_bits"] for r in records if r["type"] == "step"]
    assert got == [f"{int(loss.detach().float().cpu().view(-1).view(torch.int32)[0]) & 0xFFFFFFFF:08x}"
                   for loss in losses]
