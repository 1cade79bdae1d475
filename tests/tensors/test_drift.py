"""The batched torch statistics and sketches (detlab.tensors.drift) equal the element-by-element reference
(detlab.core.sketch) for every dtype, across chunk boundaries, and are deterministic on CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detlab.core import sketch
from detlab.tensors import drift


def tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(3 * sketch.COLUMNS + 5, generator=g), torch.randn(7, 9, generator=g).to(torch.bfloat16),
            torch.zeros(0), torch.randn(50, generator=g, dtype=torch.float64).t(), torch.tensor(7),
            torch.randn(4, 300, generator=g)[:, ::3]]  # not contiguous


def reference(ts: list[torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    arrays = [t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy() for t in ts]
    return (np.stack([sketch.stats_reference(a) for a in arrays]),
            np.stack([sketch.sketch_reference(a, i) for i, a in enumerate(arrays)]))


@pytest.mark.parametrize("chunk_rows", [1, 2, drift.CHUNK_ROWS])
def test_the_batched_pass_equals_the_reference(chunk_rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drift, "CHUNK_ROWS", chunk_rows)  # a tensor split over chunks, and chunks holding several
    found = drift.Sketcher().submit(tensors())()
    assert found is not None
    stats, sk = reference(tensors())
    np.testing.assert_allclose(sketch.unpack_stats(found[0]), stats, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sketch.unpack_sketch(found[1]), sk, rtol=1e-12, atol=1e-12)


def test_two_passes_over_equal_tensors_are_bit_equal() -> None:
    sketcher = drift.Sketcher()
    assert sketcher.submit(tensors())() == drift.Sketcher().submit([t.clone() for t in tensors()])()


def test_a_tensor_holding_nan_gives_no_drift_data() -> None:
    assert drift.Sketcher().submit([torch.ones(3), torch.tensor([1.0, float("nan")])])() is None


def test_the_result_is_what_the_tensors_held_when_submitted() -> None:
    t = torch.ones(10)
    read = drift.Sketcher().submit([t])
    t.add_(1)  # on CPU the work ran at the call; on CUDA it is queued before the change in stream order
    found = read()
    assert found is not None and sketch.unpack_stats(found[0])[0, 0] == 10.0


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")


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
def test_tensors_the_kernel_cannot_read_in_place_take_the_torch_pass_on_the_gpu() -> None:
    found = drift.Sketcher().submit([t.cuda() for t in tensors()])()
    assert found is not None
    stats, sk = reference(tensors())
    np.testing.assert_allclose(sketch.unpack_sketch(found[1]), sk, rtol=1e-12, atol=1e-12)
