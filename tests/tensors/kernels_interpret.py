"""Run under TRITON_INTERPRET=1 on the CPU, `python kernels_interpret.py onepass|fingerprint|drift` (tests/tensors/
test_onepass.py, test_fingerprint.py and test_drift.py start it): the one-pass kernel's digests equal the
fingerprint reference and its stats and sketches the drift reference; the fingerprint kernel's (detlab.tensors.
fingerprint.triton_impl) digests of awkward tensors and of every dtype equal the reference; the two-pass drift
kernel's (detlab.tensors.drift_triton) stats and sketches equal the drift reference. Prints "ok"."""

from __future__ import annotations

import sys

import numpy as np
import torch

from detlab.core import sketch
from detlab.tensors import drift_triton
from detlab.tensors import onepass_triton as op
from detlab.tensors.fingerprint import (
    FP1_KEY,
    FP2_KEY,
    digests_to_bytes,
    fingerprint_bytes,
    tensor_bytes,
    triton_impl,
)


def _index_fix() -> None:
    """Triton's interpreter (through 3.6) turns a loaded scalar into a loop bound with int() of a 1-element
    array, which NumPy 2.4 refuses (triton-lang/triton#9171): a loop bound that the kernel loads, as ours
    does, then fails under the interpreter alone. Its fix, applied here."""
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None:
        return

    def patched(tensor: object, scope: object) -> None:
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))  # type: ignore[attr-defined]

    interpreter._patch_lang_tensor = patched


def cases() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return [torch.randn(2 * sketch.COLUMNS + 5, generator=g), torch.randn(7, 9, generator=g).to(torch.bfloat16),
            torch.randn(3, generator=g).half(), torch.randn(sketch.COLUMNS, generator=g, dtype=torch.float64),
            torch.zeros(0), torch.randn(1, generator=g),
            torch.randn(sketch.COLUMNS + 1, generator=g).to(torch.bfloat16),
            torch.randn(24 * sketch.COLUMNS - 3, generator=g)]  # groups of rows that share a row bucket


def check_values(ts: list[torch.Tensor], values: np.ndarray) -> None:
    """[n, 3 + K] values against the drift references."""
    arrays = [t.double().numpy() for t in ts]
    stats = np.stack([sketch.stats_reference(a) for a in arrays])
    sk = np.stack([sketch.sketch_reference(a, i) for i, a in enumerate(arrays)])
    np.testing.assert_allclose(values[:, : sketch.STATS], stats, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(values[:, sketch.STATS :], sk, rtol=1e-12, atol=1e-12)


def check_once() -> None:
    ts = cases()
    assert all(op.supported(t) for t in ts), [t.data_ptr() % 16 for t in ts]
    indices = list(range(len(ts)))
    p = op.plan(ts, indices)
    s = op._new_slot(p)
    op.compute(p, s)
    digests, values = op.read(p, s)
    want = digests_to_bytes([fingerprint_bytes(tensor_bytes(t)) for t in ts])
    assert digests == want, (digests, want)
    check_values(ts, values)
    op.compute(p, s)  # a second run into the same slot: zeroed, the same result
    assert op.read(p, s)[0] == want


def check_onepass() -> None:
    check_once()
    op.ROWS_PER_PROGRAM = 2  # a group's rows cut into several programs, and a program of one row
    check_once()


def check_drift() -> None:
    ts = cases()
    check_values(ts, drift_triton.compute(ts, range(len(ts)), torch.device("cpu")).numpy())


def check_fingerprint() -> None:
    cpu = torch.device("cpu")
    g = torch.Generator().manual_seed(4)
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int8, torch.bool]
    ts = triton_impl._check_cases(cpu, triton_impl.CONFIG.tile)  # what the kernel's self-check runs on a GPU
    ts += [torch.randint(0, 2, (1000 + i,), generator=g).to(dtype) for i, dtype in enumerate(dtypes)]
    for key in (FP1_KEY, FP2_KEY):
        p = triton_impl.plan(ts, key=key)
        triton_impl._launch_and_copy(p)
        want = [fingerprint_bytes(tensor_bytes(t), key=key) for t in ts]
        assert triton_impl.read_digests(p) == want, key


def main() -> None:
    _index_fix()
    {"onepass": check_onepass, "fingerprint": check_fingerprint, "drift": check_drift}[sys.argv[1]]()
    print("ok")

if __name__ == "__main__":
    main()
