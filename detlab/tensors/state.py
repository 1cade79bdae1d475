"""The training state beside the model's tensors, as a step records it (detlab.core.wire.StepState): the step's
input batch, the random generators' states and the optimizer's hyperparameters, entry by entry.

Each entry is compared for equality only: a tensor's fingerprint with its shape and dtype, a generator's state
hashed, a hyperparameter as its exact text (`repr` of a float round-trips) where that is short. A batch's tensors
are fingerprinted where they live, queued like the model's (detlab.tensors.digests): the loop does not wait.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

    from detlab.tensors.digests import Digester

MAX_VALUE = 64  # StepState values: longer text is hashed
MAX_ENTRIES = 4096  # per component (StepState)


def _hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _text(value: Any) -> str:
    """A value as its exact text where that is short, else its hash."""
    text = repr(value)
    return text if len(text) <= MAX_VALUE else _hash(text.encode())


# ---- the batch ----------------------------------------------------------------------------------------------

def flatten(batch: Any, path: str = "") -> list[tuple[str, Any]]:
    """(path, leaf) for a tensor or a nested dict / list / tuple of them: `x`, `[0]`, `input_ids`, `[1].mask`.
    A bare tensor is `batch`."""
    if isinstance(batch, Mapping):
        return [leaf for k, v in batch.items() for leaf in flatten(v, f"{path}.{k}" if path else str(k))]
    if isinstance(batch, (list, tuple)):
        return [leaf for i, v in enumerate(batch) for leaf in flatten(v, f"{path}[{i}]")]
    return [(path or "batch", batch)]


def submit_batch(batch: Any, digester: Digester) -> Callable[[], dict[str, str]]:
    """Queue the fingerprints of a batch's tensors now; the returned function gives path -> digest (read on the
    writer thread). Non-tensor leaves (numpy arrays, numbers, strings) are hashed at the call."""
    import torch

    leaves = flatten(batch)
    if len(leaves) > MAX_ENTRIES:
        raise ValueError(f"batch= holds {len(leaves)} tensors; at most {MAX_ENTRIES} are recorded")
    tensors = [(p, t) for p, t in leaves if isinstance(t, torch.Tensor)]
    others = {p: _hash(v.tobytes() + f"{v.shape}{v.dtype}".encode()) if isinstance(v, np.ndarray) else _text(v)
              for p, v in leaves if not isinstance(v, torch.Tensor)}
    described = [f"{tuple(t.shape)} {t.dtype}" for _, t in tensors]
    pending = digester.submit([t.detach() for _, t in tensors]) if tensors else None

    def read() -> dict[str, str]:
        from detlab.tensors import fingerprint as fp

        packed = pending.packed() if pending is not None else b""
        found = [fp.bytes_to_digest(d) for d in fp.split_packed(packed)]
        out = {p: _hash(f"{d} {s}".encode()) for (p, _), d, s in zip(tensors, found, described, strict=True)}
        return {p: out.get(p) or others[p] for p, _ in leaves}

    return read


# ---- random generators -----------------------------------------------------------------------------------------

Generators = bool | Sequence[Any] | Mapping[str, Any]


def generator_state(gen: Any) -> str:
    """The hash of one generator's state: a torch.Generator, numpy Generator / RandomState, or random.Random."""
    import torch

    if isinstance(gen, torch.Generator):
        return _hash(gen.get_state().numpy().tobytes())
    if isinstance(gen, np.random.Generator):
        return _hash(json.dumps(gen.bit_generator.state, sort_keys=True, default=str).encode())
    if isinstance(gen, np.random.RandomState):
        return _numpy_state(gen.get_state())
    if isinstance(gen, random.Random):
        return _hash(repr(gen.getstate()).encode())
    raise TypeError(f"rng= takes torch.Generator, numpy Generator or RandomState and random.Random objects, got "
                    f"{type(gen).__name__}")


def _numpy_state(state: Any) -> str:
    name, keys, pos, has_gauss, gauss = state
    return _hash(f"{name} {pos} {has_gauss} {gauss!r}".encode() + np.asarray(keys).tobytes())


def named_generators(rng: Generators) -> list[tuple[str, Any]]:
    """The generators given as rng=[...] (`rng[0]` ...) or rng={"name": gen}, checked now."""
    if isinstance(rng, bool):
        return []
    found = list(rng.items()) if isinstance(rng, Mapping) else [(f"rng[{i}]", g) for i, g in enumerate(rng)]
    for _, gen in found:
        generator_state(gen)  # refuses what is not a generator, at Recorder(...) rather than at a step
    return found


def rng_states(extra: list[tuple[str, Any]], *, defaults: bool) -> dict[str, str]:
    """The states of the default generators (torch CPU, each CUDA device once CUDA is initialised, numpy's global,
    Python's `random`) when `defaults`, and of the named ones."""
    import torch

    out: dict[str, str] = {}
    if defaults:
        out["torch cpu"] = _hash(torch.get_rng_state().numpy().tobytes())
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # never initialise CUDA to read it
            for i in range(torch.cuda.device_count()):
                out[f"torch cuda:{i}"] = _hash(torch.cuda.get_rng_state(i).numpy().tobytes())
        out["numpy"] = _numpy_state(np.random.get_state())
        out["python"] = _hash(repr(random.getstate()).encode())
    for name, gen in extra:
        out[name] = generator_state(gen)
    return out


# ---- the optimizer's hyperparameters and non-tensor state ----------------------------------------------------

def optimizer_entries(optimizer: torch.optim.Optimizer, names: dict[int, str]) -> dict[str, str]:
    """Each param group's hyperparameters (`param_groups[0].lr` ...: an LR scheduler that restarted shows here)
    and the per-parameter state that is not a tensor (`fc1.weight.step` where an optimizer keeps a number).
    `names`: id(parameter) -> its name."""
    import torch

    out: dict[str, str] = {}
    for g, group in enumerate(optimizer.param_groups):
        for key, value in sorted(group.items()):
            if key == "params":
                continue
            if isinstance(value, torch.Tensor):
                value = value.detach().cpu().tolist()
            out[f"param_groups[{g}].{key}"] = _text(value)
        for i, p in enumerate(group["params"]):
            state = optimizer.state.get(p) or {}
            base = names.get(id(p), f"optimizer.group{g}.param{i}")
            for key, value in state.items():
                if not isinstance(value, torch.Tensor):
                    out[f"{base}.{key}"] = _text(value)
    return out
