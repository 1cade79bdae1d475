"""The statistics and sketches (detlab.tensors.drift) equal the element-by-element reference (detlab.core.sketch)
for every dtype, across chunk boundaries, and are deterministic on CPU: both CPU passes, torch's and the compiled
kernel's (detlab.tensors.drift_numba, which the recorder runs on its writer thread where numba is installed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detlab.core import sketch
from detlab.tensors import drift, drift_numba
from tests.tensors.interpreter import interpreted, needs_triton


@pytest.fixture(params=["torch", "numba"])
def cpu_pass(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which CPU pass a Sketcher runs: torch's (DETLAB_FP_NUMBA=0, or no numba) or the compiled kernel."""
    if request.param == "numba" and not drift_numba.available():
        pytest.skip("needs numba")
    monkeypatch.setenv("DETLAB_FP_NUMBA", "1" if request.param == "numba" else "0")
    return str(request.param)


def tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(3 * sketch.COLUMNS + 5, generator=g), torch.randn(7, 9, generator=g).to(torch.bfloat16),
            torch.zeros(0), torch.randn(50, generator=g, dtype=torch.float64).t(), torch.tensor(7),
            torch.randn(4, 300, generator=g)[:, ::3],  # not contiguous
            torch.randn(5, 3, generator=g).half(), torch.randn(20, generator=g, dtype=torch.complex64),
            -torch.rand(2 * sketch.COLUMNS, generator=g)]  # every row's max |x| is its min


def reference(ts: list[torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    arrays = [(torch.view_as_real(t) if t.is_complex() else t).double().numpy() for t in ts]
    return (np.stack([sketch.stats_reference(a) for a in arrays]),
            np.stack([sketch.sketch_reference(a, i) for i, a in enumerate(arrays)]))


def assert_reference(found: tuple[bytes, bytes] | None) -> None:
    assert found is not None
    stats, sk = reference(tensors())
    np.testing.assert_allclose(sketch.unpack_stats(found[0]), stats, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sketch.unpack_sketch(found[1]), sk, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_rows", [1, 2, drift.CHUNK_ROWS])
def test_the_torch_pass_equals_the_reference(chunk_rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DETLAB_FP_NUMBA", "0")
    monkeypatch.setattr(drift, "CHUNK_ROWS", chunk_rows)  # a tensor split over chunks, and chunks holding several
    assert_reference(drift.Sketcher().submit(tensors())())


@pytest.mark.skipif(not drift_numba.available(), reason="needs numba")
def test_the_compiled_kernel_equals_the_reference_and_the_sketcher_runs_it_on_the_cpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ts = tensors()
    found = drift_numba.values(drift_numba.row_maps(drift._numels(ts), range(len(ts))), ts)
    assert_reference((sketch.pack(found[:, : sketch.STATS]), sketch.pack(found[:, sketch.STATS :])))

    def torch_pass(*_: object) -> None:
        raise AssertionError("the torch pass ran")

    monkeypatch.setattr(drift, "compute", torch_pass)
    monkeypatch.delenv("DETLAB_FP_NUMBA", raising=False)
    assert_reference(drift.Sketcher().submit(tensors())())
    assert_reference(drift.Sketcher().submit(tensors(), defer_cpu=True)())


def test_two_passes_over_equal_tensors_are_bit_equal(cpu_pass: str) -> None:
    sketcher = drift.Sketcher()
    assert sketcher.submit(tensors())() == drift.Sketcher().submit([t.clone() for t in tensors()])()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_tensor_holding_nan_or_inf_gives_no_drift_data(cpu_pass: str, bad: float) -> None:
    assert drift.Sketcher().submit([torch.ones(3), torch.tensor([1.0, bad])])() is None


def test_the_result_is_what_the_tensors_held_when_submitted(cpu_pass: str) -> None:
    t = torch.ones(10)
    read = drift.Sketcher().submit([t])
    t.add_(1)  # on CPU the work ran at the call; on CUDA it is queued before the change in stream order
    found = read()
    assert found is not None and sketch.unpack_stats(found[0])[0, 0] == 10.0


def test_a_deferred_pass_runs_when_read(cpu_pass: str) -> None:
    """defer_cpu (the recorder's snapshot): the pass runs in the reader's call, on the tensors as they are then."""
    t = torch.ones(10)
    read = drift.Sketcher().submit([t], defer_cpu=True)
    t.add_(1)
    found = read()
    assert found is not None and sketch.unpack_stats(found[0])[0, 0] == 20.0


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")


@needs_triton
def test_the_triton_kernel_under_the_interpreter_equals_the_references() -> None:
    interpreted("drift")


@needs_cuda
def test_the_triton_kernel_equals_the_reference_on_every_float_dtype() -> None:
    g = torch.Generator().manual_seed(1)
    ts = [torch.randn(3 * sketch.COLUMNS + 5, generator=g), torch.randn(7, 9, generator=g).to(torch.bfloat16),
          torch.randn(sketch.COLUMNS, generator=g).half(), torch.randn(50, generator=g, dtype=torch.float64),
          torch.zeros(0), torch.randn(1, generator=g)]
    kernel = drift._triton()
    assert kernel is not None and all(kernel.supported(t.cuda()) for t in ts)
    found = drift.Sketcher().submit([t.cuda() for t in ts])()
    assert found is not None
    stats, sk = reference([t.float() if t.dtype == torch.float16 else t for t in ts])
    np.testing.assert_allclose(sketch.unpack_stats(found[0]), stats, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sketch.unpack_sketch(found[1]), sk, rtol=1e-12, atol=1e-12)


@needs_cuda
def test_the_triton_kernel_gives_the_same_bits_on_every_run() -> None:
    """The two-pass path's rows are added per tensor in a fixed order: float64 atomics (index_add_, before) gave
    values that differed in their last bits from run to run, so two identical runs read as drifting apart."""
    kernel = drift._triton()
    assert kernel is not None
    dev = torch.device("cuda", 0)
    g = torch.Generator(dev).manual_seed(5)
    ts = [torch.randn(4096, 4096, device=dev, generator=g), torch.randn(3, 50_000, device=dev, generator=g)]
    seen = {kernel.compute(ts, range(len(ts)), dev).cpu().numpy().tobytes() for _ in range(50)}
    assert len(seen) == 1


@needs_cuda
def test_tensors_the_kernel_cannot_read_in_place_take_the_torch_pass_on_the_gpu() -> None:
    found = drift.Sketcher().submit([t.cuda() for t in tensors()])()
    assert found is not None
    stats, sk = reference(tensors())
    np.testing.assert_allclose(sketch.unpack_sketch(found[1]), sk, rtol=1e-12, atol=1e-12)
