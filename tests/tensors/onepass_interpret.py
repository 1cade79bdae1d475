"""Run under TRITON_INTERPRET=1 on the CPU (tests/tensors/test_onepass.py starts it): the one-pass kernel's
digests equal the fingerprint reference and its stats and sketches the drift reference. Prints "ok"."""

from __future__ import annotations

import numpy as np
import torch

from detlab.core import sketch
from detlab.tensors import onepass_triton as op
from detlab.tensors.fingerprint import fingerprint_bytes, tensor_bytes


def cases() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return [torch.randn(2 * sketch.COLUMNS + 5, generator=g), torch.randn(7, 9, generator=g).to(torch.bfloat16),
            torch.randn(3, generator=g).half(), torch.randn(sketch.COLUMNS, generator=g, dtype=torch.float64),
            torch.zeros(0), torch.randn(1, generator=g),
            torch.randn(sketch.COLUMNS + 1, generator=g).to(torch.bfloat16)]


def main() -> None:
    ts = cases()
    assert all(op.supported(t) for t in ts), [t.data_ptr() % 16 for t in ts]
    indices = list(range(len(ts)))
    p = op.plan(ts, indices)
    s = op._new_slot(p)
    op.compute(p, s)
    digests, values = op.read(p, s)
    want = [fingerprint_bytes(tensor_bytes(t)) for t in ts]
    assert digests == want, (digests, want)
    arrays = [t.double().numpy() for t in ts]
    stats = np.stack([sketch.stats_reference(a) for a in arrays])
    sk = np.stack([sketch.sketch_reference(a, i) for i, a in enumerate(arrays)])
    np.testing.assert_allclose(values[:, : sketch.STATS], stats, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(values[:, sketch.STATS :], sk, rtol=1e-12, atol=1e-12)
    op.compute(p, s)  # a second run into the same slot: zeroed, the same result
    assert op.read(p, s)[0] == want
    print("ok")


if __name__ == "__main__":
    main()
