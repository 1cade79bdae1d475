"""The one-pass kernel (detlab.tensors.onepass_triton): its digests are the fingerprint's and its stats and
sketches the drift references'; the recorder uses it on CUDA, with torch.compile'd models and with a training
step captured as a CUDA graph, and records what the two passes record. On the CPU: the kernel under Triton's
interpreter (skipped without Triton); the rest on a CUDA GPU (skipped elsewhere)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import detlab
from detlab.core import sketch
from detlab.tensors.fingerprint import FP_VERSION, digests_to_bytes, fingerprint_many
from tests.tensors.interpreter import interpreted, needs_triton

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")


@needs_triton
def test_the_kernel_under_the_interpreter_equals_the_references() -> None:
    interpreted("onepass")


def references(ts: list[torch.Tensor]) -> tuple[list[str], np.ndarray, np.ndarray]:
    arrays = [t.detach().double().cpu().numpy() for t in ts]
    return (fingerprint_many([t.detach().cpu() for t in ts]), np.stack([sketch.stats_reference(a) for a in arrays]),
            np.stack([sketch.sketch_reference(a, i) for i, a in enumerate(arrays)]))


def cases(dev: torch.device) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [t.to(dev) for t in (
        torch.randn(5 * sketch.COLUMNS + 7, generator=g), torch.randn(7, 9, generator=g).to(torch.bfloat16),
        torch.randn(3, generator=g).half(), torch.randn(sketch.COLUMNS, generator=g, dtype=torch.float64),
        torch.zeros(0), torch.randn(1, generator=g), torch.randn(1 << 20, generator=g).to(torch.bfloat16))]


@needs_cuda
def test_the_stats_and_sketches_are_the_same_bits_on_every_run() -> None:
    """A tensor's programs are added in a fixed order: float64 atomics (index_add_, before) gave values that
    differed in their last bits from run to run, so two identical runs read as drifting apart."""
    from detlab.tensors import onepass_triton

    dev = torch.device("cuda", 0)
    g = torch.Generator(dev).manual_seed(5)
    ts = [torch.randn(4096, 4096, device=dev, generator=g), torch.randn(3, 50_000, device=dev, generator=g)]
    p = onepass_triton.plan(ts, range(len(ts)))
    s = onepass_triton._new_slot(p)
    seen = set()
    for _ in range(50):
        onepass_triton.compute(p, s)
        torch.cuda.synchronize()
        seen.add(onepass_triton.read(p, s)[1].tobytes())
    assert len(seen) == 1


@needs_cuda
def test_one_pass_on_the_gpu_equals_the_references_step_after_step() -> None:
    from detlab.tensors import onepass_triton

    dev = torch.device("cuda", 0)
    ts = cases(dev)
    runner = onepass_triton.OnePass()
    for step in range(4):  # launched, then captured as a graph and replayed
        read = runner.submit(ts)
        want = references(ts)
        for t in ts:
            t.mul_(1.5)  # queued after the submit: not seen
        digests, values = read()
        assert digests == digests_to_bytes(want[0]), step
        np.testing.assert_allclose(values[:, : sketch.STATS], want[1], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(values[:, sketch.STATS :], want[2], rtol=1e-12, atol=1e-12)


def step_records(out: Path) -> dict[int, dict]:
    records = [json.loads(line) for line in (out / "rank0.jsonl").read_text().splitlines()]
    assert records[0]["fingerprint_impl"] == "triton"
    return {r["step"]: r for r in records if r["type"] == "step"}


def digests_of(record: dict) -> list[str]:
    return [f"{FP_VERSION}:" + record["digests"][i : i + 32] for i in range(0, len(record["digests"]), 32)]


def train_and_record(out: Path, *, compiled: bool, monkeypatch: pytest.MonkeyPatch, one_pass: bool) -> dict[int, list]:
    monkeypatch.setenv("DETLAB_ONEPASS", "1" if one_pass else "0")
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    run = torch.compile(model) if compiled else model
    expected = {}
    with detlab.Recorder(out=out) as rec:
        for step in range(5):
            x = torch.randn(32, 256, device=dev, generator=torch.Generator(dev).manual_seed(step))
            loss = run(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            expected[step] = references(list(model.parameters()))
            rec.step(step, run, loss=loss)
    got = step_records(out)
    for step, (want_digests, stats, sk) in expected.items():
        assert digests_of(got[step]) == want_digests, step
        drift = got[step]["drift"]
        np.testing.assert_allclose(sketch.unpack_stats(bytes.fromhex(drift["stats"])), stats, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(sketch.unpack_sketch(bytes.fromhex(drift["sketch"])), sk, rtol=1e-12, atol=1e-12)
    return {s: digests_of(r) for s, r in got.items()}


@needs_cuda
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "torch.compile"])
def test_the_recorder_records_what_two_passes_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     compiled: bool) -> None:
    one = train_and_record(tmp_path / "one", compiled=compiled, monkeypatch=monkeypatch, one_pass=True)
    two = train_and_record(tmp_path / "two", compiled=compiled, monkeypatch=monkeypatch, one_pass=False)
    assert one == two


@needs_cuda
def test_a_training_step_captured_as_a_cuda_graph_is_recorded_outside_it(tmp_path: Path) -> None:
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x = torch.randn(64, 256, device=dev)

    def train_step() -> torch.Tensor:
        opt.zero_grad(set_to_none=False)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs' docs ask
        for _ in range(3):
            train_step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = train_step()
    expected = {}
    with detlab.Recorder(out=tmp_path / "g") as rec:
        for step in range(4):
            graph.replay()
            expected[step] = fingerprint_many(list(model.parameters()))
            rec.step(step, model, loss=loss)  # outside the graph, behind its replay on the stream
    got = step_records(tmp_path / "g")
    assert {s: digests_of(r) for s, r in got.items()} == expected
    assert len(set(map(tuple, expected.values()))) == 4  # the weights changed at every replay


@needs_cuda
def test_a_list_the_kernel_cannot_read_in_place_is_left_to_the_two_passes() -> None:
    from detlab.tensors.onepass import OnePassQueue

    dev = torch.device("cuda", 0)
    floats = torch.randn(100, device=dev)
    assert OnePassQueue().submit([floats]) is not None
    assert OnePassQueue().submit([floats, torch.arange(5, device=dev)]) is None  # an integer tensor
    assert OnePassQueue().submit([floats, torch.randn(4, 6, device=dev).t()]) is None  # not contiguous


@needs_triton
def test_the_queue_keeps_a_slot_for_every_step_the_recorders_writer_may_hold() -> None:
    """A loop that runs ahead of the recorder's writer (a small model, or a step captured as a CUDA graph, can be
    many steps ahead of the GPU) has up to the spool's DEPTH records waiting, one being written and one being
    queued. Each of them reuses a kept slot, its buffers and its graph, from one round to the next; with 3 kept,
    every step beyond them made new buffers and launched without a graph."""
    from detlab.sdk.spool import DEPTH
    from detlab.tensors import onepass_triton as op
    from detlab.tensors.named import ListKey

    tensors = [torch.randn(100), torch.randn(5000)]
    queue, key = op.OnePass(), ListKey(tensors)
    rounds = []
    for _ in range(3):
        taken = [queue._slot(key, tensors) for _ in range(DEPTH + 2)]
        for _, slot in taken:
            queue._release(slot)
        rounds.append({id(slot) for _, slot in taken})
    assert len(rounds[0]) == DEPTH + 2
    assert rounds[0] == rounds[1] == rounds[2]
