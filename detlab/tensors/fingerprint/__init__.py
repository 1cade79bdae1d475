"""Tensor fingerprints (version fp2; fp1 on request): 128-bit digests of a tensor's logical bytes.

`fingerprint_bytes` is the numpy reference; `fingerprint` / `fingerprint_many` pick the fastest
implementation for the tensor's device and always agree with it. The algorithm, its guarantees, its threat
model and test vectors are in docs/fingerprint.md. Tensors whose bytes are not their values (sparse,
quantized, nested, meta, dispatch subclasses) are refused with `UnsupportedTensorError`. torch is imported
lazily: backend code can use the bytes reference, digest packing and `FP_VERSION` without it.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .reference import (
    DEFAULT_KEY,
    DIGEST_BYTES,
    FP1_KEY,
    FP2_KEY,
    FP_VERSION,
    PUBLIC_KEYS,
    DigestKey,
    bytes_to_digest,
    digest_to_bytes,
    digests_to_bytes,
    fingerprint_bytes,
    split_packed,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_KEY",
    "DIGEST_BYTES",
    "FP1_KEY",
    "FP2_KEY",
    "FP_VERSION",
    "PUBLIC_KEYS",
    "DigestKey",
    "UnsupportedTensorError",
    "bytes_to_digest",
    "certificate",
    "digest_to_bytes",
    "digests_to_bytes",
    "fingerprint",
    "fingerprint_bytes",
    "fingerprint_many",
    "implementation_name",
    "split_packed",
    "tensor_bytes",
]

# Set DETLAB_FP_TRITON=0 to force the plain torch path on CUDA (debugging, A/B timing).
_TRITON_ENV = "DETLAB_FP_TRITON"
# Set DETLAB_FP_NUMBA=0 to force the plain torch path on the CPU (the same digests, slower).
_NUMBA_ENV = "DETLAB_FP_NUMBA"
# (device index, version) -> whether the Triton kernel passed its self-check there
_triton_ok: dict[tuple[int, str], bool] = {}
# Host copies for `certificate` / `tensor_bytes` of GPU tensors go in slices of this size.
_HOST_SLICE_BYTES = 64 << 20


class UnsupportedTensorError(TypeError):
    """A tensor whose bytes are not its values (or that has none); the message says what to hash instead."""


def _as_device(device: Any) -> torch.device:
    import torch

    return device if isinstance(device, torch.device) else torch.device(device)


def _triton_ready(device: torch.device, key: DigestKey = DEFAULT_KEY) -> bool:
    import torch

    # ROCm builds of torch call their GPUs "cuda" too; Triton runs there, behind the same self-check.
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    if os.environ.get(_TRITON_ENV) == "0" or not key.public:
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if (index, key.version) not in _triton_ok:
        try:
            from . import triton_impl
        except ImportError:
            _triton_ok[index, key.version] = False
        else:
            problem = triton_impl.check_against_reference(torch.device("cuda", index), key=key)
            if problem is not None:
                warnings.warn(
                    f"fingerprint: Triton kernel disabled on cuda:{index} for {key.version}, using torch-cuda "
                    f"({problem})",
                    RuntimeWarning,
                    stacklevel=3,
                )
            _triton_ok[index, key.version] = problem is None
    return _triton_ok[index, key.version]


def _numba_ready(device: torch.device) -> bool:
    if device.type != "cpu" or os.environ.get(_NUMBA_ENV) == "0":
        return False
    from . import cpu_impl

    return cpu_impl.available()


def implementation_name(device: Any) -> str:
    """Name of the implementation `fingerprint` uses on `device` ("numba-cpu", "torch-cpu", "torch-cuda",
    "triton")."""
    dev = _as_device(device)
    if _numba_ready(dev):
        return "numba-cpu"
    return "triton" if _triton_ready(dev) else f"torch-{dev.type}"


def fingerprint(tensor: torch.Tensor, *, key: DigestKey = DEFAULT_KEY) -> str:
    """Digest of a tensor's logical bytes (row-major, whatever its strides), e.g. 'fp2:<32 hex>'.

    `key=FP1_KEY` gives the fp1 digest. With a secret key (`DigestKey.random()`), the keyed digest
    'fp2-keyed:<32 hex>': comparable only with digests under the same key. Raises UnsupportedTensorError for
    tensors whose bytes are not their values.
    """
    return fingerprint_many([tensor], key=key)[0]


def fingerprint_many(tensors: Sequence[torch.Tensor], *, key: DigestKey = DEFAULT_KEY) -> list[str]:
    """Digests of a list of tensors under `key`; under a public key (fp2, fp1), CUDA tensors on one device share
    one Triton launch. CPU tensors take the compiled kernel where numba is installed, under every key. Keyed
    digests of CUDA tensors run on the torch implementation (the Triton kernel's constants are public).
    """
    from .torch_impl import fingerprint_torch

    if not key.public:
        return [_fingerprint_keyed(t, key) for t in tensors]
    devices = {t.device for t in tensors}
    if len(devices) == 1 and _triton_ready(next(iter(devices)), key):
        # The common case (a model's parameters): one launch for the list as given, no regrouping by index.
        from .triton_impl import fingerprint_many_triton

        return fingerprint_many_triton(tensors, key=key)
    digests: list[str | None] = [None] * len(tensors)
    by_device: dict[Any, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    for device, idx in by_device.items():
        if _triton_ready(device, key):
            from .triton_impl import fingerprint_many_triton

            for i, d in zip(idx, fingerprint_many_triton([tensors[i] for i in idx], key=key), strict=True):
                digests[i] = d
        elif _numba_ready(device):
            from .cpu_impl import fingerprint_cpu

            for i in idx:
                digests[i] = fingerprint_cpu(tensors[i], key=key)
        else:
            for i in idx:
                digests[i] = fingerprint_torch(tensors[i], key=key)
    return cast(list[str], digests)  # every index belongs to exactly one device group


def _fingerprint_keyed(tensor: torch.Tensor, key: DigestKey) -> str:
    if _numba_ready(tensor.device):
        from .cpu_impl import fingerprint_cpu

        return fingerprint_cpu(tensor, key=key)
    from .torch_impl import fingerprint_torch

    return fingerprint_torch(tensor, key=key)


def _host_slices(tensor: torch.Tensor) -> Iterator[np.ndarray]:
    from .torch_impl import byte_view

    u8 = byte_view(tensor)
    for start in range(0, u8.numel(), _HOST_SLICE_BYTES):
        yield u8[start : start + _HOST_SLICE_BYTES].cpu().numpy()


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The logical bytes a fingerprint covers, copied to the host (row-major, native little-endian)."""
    return b"".join(s.tobytes() for s in _host_slices(tensor))


def certificate(tensor: torch.Tensor) -> str:
    """sha256 hex of the same logical bytes: slower, cryptographic, for audits rather than every step."""
    h = hashlib.sha256()
    for s in _host_slices(tensor):
        h.update(s.data)
    return h.hexdigest()
