"""Fingerprints of the tensors in a checkpoint (.safetensors or torch.save), and the diff of two.

Tensors are read one at a time (safetensors' lazy reader; torch.load with mmap for zip checkpoints),
and pickled checkpoints load with weights_only=True: a checkpoint is data, never code. A diff of two files
is a certificate: keyed digests under a key drawn for that diff, or sha256 (strict).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import torch

from detlab.tensors import fingerprint as fp


class CheckpointError(ValueError):
    """The file cannot be read as a checkpoint; the message says why."""


def _flatten(obj: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        yield prefix or "tensor", obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from _flatten(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _flatten(value, f"{prefix}.{i}" if prefix else str(i))


def iter_tensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor in the checkpoint; nested state dicts get dotted names."""
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    yield name, f.get_tensor(name)
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from exc
        return
    try:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            obj = torch.load(path, map_location="cpu", weights_only=True)  # legacy (non-zip) format
    except Exception as exc:  # noqa: BLE001 - unpickling errors come in many types
        raise CheckpointError(f"{path}: not a readable torch.save checkpoint ({type(exc).__name__}: {exc})") from exc
    yield from _flatten(obj)


def _entries(path: Path, digests: Callable[[torch.Tensor], dict[str, str]]) -> dict[str, dict[str, Any]]:
    """name -> {**digests(tensor), shape, dtype}; a tensor that fingerprints refuse is an error naming it."""
    out = {}
    for name, t in iter_tensors(path):
        try:
            found = digests(t)
        except fp.UnsupportedTensorError as exc:
            raise CheckpointError(f"{path}: tensor {name!r}: {exc}") from exc
        out[name] = {**found, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
    return out


def fingerprints(path: Path, *, certificates: bool = False, version: str = fp.FP_VERSION) -> dict[str, dict[str, Any]]:
    """name -> {digest, shape, dtype[, sha256]} for every tensor in the checkpoint (digests of `version`)."""
    key = fp.PUBLIC_KEYS[version]

    def digests(t: torch.Tensor) -> dict[str, str]:
        return {"digest": fp.fingerprint(t, key=key), **({"sha256": fp.certificate(t)} if certificates else {})}

    return _entries(path, digests)


def diff(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Tensors whose digest, shape or dtype differ, and tensors present in one checkpoint only."""
    return {
        "differ": sorted(n for n in a.keys() & b.keys() if a[n] != b[n]),
        "only_a": sorted(a.keys() - b.keys()),
        "only_b": sorted(b.keys() - a.keys()),
    }


DiffMode = Literal["keyed", "strict"]


def diff_files(a: Path, b: Path, *, strict: bool = False) -> dict[str, Any]:
    """`diff` of two checkpoint files as a certificate: {mode, differ, only_a, only_b}.

    "keyed" (default): fp1's algorithm under a key drawn for this call alone, so that files built to collide
    under fp1's public constants, or under any key fixed in advance, are not known to survive it (what is
    proven and what is not: docs/fingerprint.md, "Guarantees"). "strict": sha256 of each tensor's bytes.
    """
    mode: DiffMode = "strict" if strict else "keyed"
    if strict:

        def digests(t: torch.Tensor) -> dict[str, str]:
            return {"sha256": fp.certificate(t)}

    else:
        key = fp.DigestKey.random()  # drawn after the files exist, known to no one else, never printed

        def digests(t: torch.Tensor) -> dict[str, str]:
            return {"digest": fp.fingerprint(t, key=key)}

    return {"mode": mode, **diff(_entries(a, digests), _entries(b, digests))}
