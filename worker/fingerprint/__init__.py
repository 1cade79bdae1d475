"""Tensor fingerprints, version fp1: 128-bit, order-independent digests of a tensor's logical bytes.

`fingerprint_bytes` is the numpy reference; `fingerprint` / `fingerprint_many` pick the fastest
implementation for the tensor's device and always agree with it. The algorithm, its guarantees and test
vectors are in docs/fingerprint.md. torch is imported lazily: backend code can use the bytes reference,
digest packing and `FP_VERSION` without it.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .reference import FP_VERSION, bytes_to_digest, digest_to_bytes, fingerprint_bytes

if TYPE_CHECKING:
    import torch

__all__ = [
    "FP_VERSION",
    "bytes_to_digest",
    "certificate",
    "digest_to_bytes",
    "fingerprint",
    "fingerprint_bytes",
    "fingerprint_many",
    "implementation_name",
    "tensor_bytes",
]

# Set DETLAB_FP_TRITON=0 to force the plain torch path on CUDA (debugging, A/B timing).
_TRITON_ENV = "DETLAB_FP_TRITON"
# device index -> whether the Triton kernel passed its self-check there
_triton_ok: dict[int, bool] = {}
# Host copies for `certificate` / `tensor_bytes` of GPU tensors go in slices of this size.
_HOST_SLICE_BYTES = 64 << 20


def _as_device(device: Any) -> torch.device:
    import torch

    return device if isinstance(device, torch.device) else torch.device(device)


def _triton_ready(device: torch.device) -> bool:
    import torch

    # ROCm builds of torch call their GPUs "cuda" too; Triton runs there, behind the same self-check.
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    if os.environ.get(_TRITON_ENV) == "0":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _triton_ok:
        try:
            from . import triton_impl
        except ImportError:
            _triton_ok[index] = False
        else:
            problem = triton_impl.check_against_reference(torch.device("cuda", index))
            if problem is not None:
                warnings.warn(
                    f"fingerprint: Triton kernel disabled on cuda:{index}, using torch-cuda ({problem})",
                    RuntimeWarning,
                    stacklevel=3,
                )
            _triton_ok[index] = problem is None
    return _triton_ok[index]


def implementation_name(device: Any) -> str:
    """Name of the implementation `fingerprint` uses on `device` ("torch-cpu", "torch-cuda", "triton")."""
    dev = _as_device(device)
    return "triton" if _triton_ready(dev) else f"torch-{dev.type}"


def fingerprint(tensor: torch.Tensor) -> str:
    """fp1 digest of a tensor's logical bytes (row-major, whatever its strides), e.g. 'fp1:<32 hex>'."""
    return fingerprint_many([tensor])[0]


def fingerprint_many(tensors: Sequence[torch.Tensor]) -> list[str]:
    """fp1 digests of a list of tensors; CUDA tensors on one device share one Triton launch."""
    from .torch_impl import fingerprint_torch

    devices = {t.device for t in tensors}
    if len(devices) == 1 and _triton_ready(next(iter(devices))):
        # The common case (a model's parameters): one launch for the list as given, no regrouping by index.
        from .triton_impl import fingerprint_many_triton

        return fingerprint_many_triton(tensors)
    digests: list[str | None] = [None] * len(tensors)
    by_device: dict[Any, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    for device, idx in by_device.items():
        if _triton_ready(device):
            from .triton_impl import fingerprint_many_triton

            for i, d in zip(idx, fingerprint_many_triton([tensors[i] for i in idx]), strict=True):
                digests[i] = d
        else:
            for i in idx:
                digests[i] = fingerprint_torch(tensors[i])
    return cast(list[str], digests)  # every index belongs to exactly one device group


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
