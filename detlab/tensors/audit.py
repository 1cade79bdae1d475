"""Op audit: every aten op one training step runs, and which of them are nondeterministic here.

The step runs under PyTorch's own DebugMode (torch.utils._debug_mode), which records every op call at the
dispatch level; its pre-op hook keeps a copy of the inputs of each op's first `calls_per_op` calls (before
an in-place op changes them), with the deterministic-algorithms flags in effect at that moment. After the
step, each kept call is checked twice, on fresh copies of its inputs:

- PyTorch's check: the op runs once with `torch.use_deterministic_algorithms(True)`; its alert ("does not
  have a deterministic implementation", or cuBLAS's "not deterministic because" without
  CUBLAS_WORKSPACE_CONFIG) means PyTorch knows it is nondeterministic on this device, whatever the config set.
  The alert is asked for as the error it raises: with warn_only, an aten op called directly (as here) warns
  through C++ to stderr, never through Python's warnings, and the alert would be missed.
- Re-runs: the op runs `reruns` times under the flags it ran under in the step; the digests (detlab's
  fingerprint) of its outputs and of its inputs afterwards (an in-place or out= op writes there) are
  counted. More than one distinct result is nondeterminism seen, not inferred.

Every run of a call (the alert's too) starts from the random state the call saw in the step: the generators
passed to it as arguments and the default CPU and CUDA generators (seed and Philox offset) are set to their
state at the call before each run, and put back as the step left them after the checks. A draw (randn with
generator=, dropout, attention's dropout) is then the same draw each time: a difference is the kernel's.
Outputs that hold a random state rather than a result (`philox_seed`, `philox_offset`, `rng_state`, `unused` in the
op's schema: attention's dropout state) are not compared: without dropout PyTorch returns them uninitialized
(`at::empty` in `_efficient_attention_forward`, aten/src/ATen/native/transformers/cuda/attention.cu), so their bits
are whatever the allocator held; with dropout they are the generator's state, restored before each run, and the
dropout's effect is in the output, which is compared. Ops that return uninitialized memory (empty*) are not
compared (their bits are whatever the allocator held) and say so. Calls whose inputs exceed `MAX_KEPT_BYTES`
are counted but not re-run, and say so.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._debug_mode import DebugMode
from torch.utils._pytree import tree_flatten, tree_map

from detlab.core.diagnosis import EVIDENCE_CHARS
from detlab.core.wire import AuditOpRecord
from detlab.tensors import fingerprint as fp

MAX_KEPT_BYTES = 256 << 20  # inputs kept for re-runs, over all calls
# PyTorch's alerts (warn_only): an op without a deterministic kernel here, and cuBLAS without a fixed workspace
# (CUBLAS_WORKSPACE_CONFIG unset on CUDA >= 10.2)
ALERT_TEXTS = ("does not have a deterministic implementation", "this operation is not deterministic because")
# Ops whose output is allocated, not computed: their bits are not a result.
# Returns that carry the random state of a fused dropout, not a result (see the module's docstring).
RNG_STATE_RETURNS = frozenset({"philox_seed", "philox_offset", "rng_state", "unused"})
UNINITIALIZED = ("aten.empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty", "aten.new_empty_strided",
                 "aten.resize_")


def op_name(func: Any) -> str:
    """`aten.index_put_.default` -> `aten.index_put_` (the overload packet: what users know the op by)."""
    packet = getattr(func, "overloadpacket", None)
    return f"{func.namespace}.{packet.__name__}" if packet is not None else str(func)


@dataclass
class Kept:
    """One op call kept for checking: the op, copies of its inputs, the flags it ran under."""

    func: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    deterministic: bool
    warn_only: bool
    rng: list[tuple[torch.Generator, torch.Tensor]] = field(default_factory=list)


@dataclass
class Recorder:
    """DebugMode's pre-op hook: keeps the first `calls_per_op` calls of each op while the byte budget lasts."""

    calls_per_op: int
    budget: int = MAX_KEPT_BYTES
    kept: dict[str, list[Kept]] = field(default_factory=dict)
    over_budget: set[str] = field(default_factory=set)

    def __call__(self, func: Any, _types: Any, args: tuple[Any, ...], kwargs: dict[str, Any], _call: Any) -> None:
        if not hasattr(func, "_schema"):
            return None  # a higher-order operator (a compiled region): counted, its ops are not re-run alone
        name = op_name(func)
        calls = self.kept.setdefault(name, [])
        if len(calls) >= self.calls_per_op:
            return None
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        size = sum(t.numel() * t.element_size() for t in tensors)
        if size > self.budget:
            self.over_budget.add(name)
            return None
        self.budget -= size
        kept_args, kept_kwargs = _copy((args, kwargs))
        calls.append(Kept(func, kept_args, kept_kwargs, deterministic=torch.are_deterministic_algorithms_enabled(),
                          warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
                          rng=[(g, g.get_state()) for g in _generators((args, kwargs))]))
        return None


def _generators(tree: Any) -> list[torch.Generator]:
    """The generators a call can draw from: those passed to it, then the default CPU and (initialized) CUDA ones."""
    given = [g for g in tree_flatten(tree)[0] if isinstance(g, torch.Generator)]
    defaults = [torch.default_generator]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        defaults += list(torch.cuda.default_generators)
    return given + [g for g in defaults if all(g is not other for other in given)]


class _Rng:
    """Sets the generators of a call to their state at the call (`reset`, before each run), and puts them back as
    they were before the block after it."""

    def __init__(self, call: Kept) -> None:
        self.call = call

    def __enter__(self) -> _Rng:
        self.before = [(g, g.get_state()) for g, _ in self.call.rng]
        return self

    def reset(self) -> None:
        for g, state in self.call.rng:
            g.set_state(state)

    def __exit__(self, *_exc: object) -> None:
        for g, state in self.before:
            g.set_state(state)


def _copy(tree: Any) -> Any:
    # detached copies with the same strides, so a re-run sees the layout the step saw
    return tree_map(lambda x: x.detach().clone(memory_format=torch.preserve_format)
                    if isinstance(x, torch.Tensor) else x, tree)


def trace_step(step: Callable[[], None], calls_per_op: int) -> tuple[Counter[str], Recorder]:
    """Run `step` under DebugMode: how many times each op ran, and the calls kept for checking."""
    recorder = Recorder(calls_per_op)
    mode = DebugMode(record_output=False, record_profiler_context=False)
    with mode, DebugMode.dispatch_hooks(pre_log_hook=recorder):
        step()
    counts = Counter(op_name(call.op) for call in mode.operators if hasattr(call, "op"))
    return counts, recorder


def _results(func: Any, out: Any) -> Any:
    """An op's outputs without those its schema names as random state (`RNG_STATE_RETURNS`)."""
    names = [r.name for r in func._schema.returns]
    if isinstance(out, tuple | list) and len(out) == len(names) and RNG_STATE_RETURNS & set(names):
        return tuple(o for o, n in zip(out, names, strict=True) if n not in RNG_STATE_RETURNS)
    return out


def _digests(tree: Any) -> tuple[str, ...]:
    tensors = [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor) and t.layout == torch.strided]
    return tuple(fp.fingerprint_many([t.contiguous() for t in tensors])) if tensors else ()


class _Flags:
    """Sets torch's deterministic-algorithms flags for a block and restores them after."""

    def __init__(self, deterministic: bool, warn_only: bool) -> None:
        self.want = (deterministic, warn_only)

    def __enter__(self) -> None:
        self.before = (torch.are_deterministic_algorithms_enabled(),
                       torch.is_deterministic_algorithms_warn_only_enabled())
        torch.use_deterministic_algorithms(self.want[0], warn_only=self.want[1])

    def __exit__(self, *_exc: object) -> None:
        torch.use_deterministic_algorithms(self.before[0], warn_only=self.before[1])


def alert(call: Kept) -> str | None:
    """PyTorch's own verdict: its alert text when the op has no deterministic implementation here, else None.
    Asked for as an error (see the module's docstring); an error that is not the alert is raised."""
    args, kwargs = _copy((call.args, call.kwargs))
    with _Rng(call) as rng, _Flags(True, False), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rng.reset()
        try:
            call.func(*args, **kwargs)
        except RuntimeError as exc:
            if not any(text in str(exc) for text in ALERT_TEXTS):
                raise
            return str(exc).strip().splitlines()[0]
    # an op that warns from Python whatever the flag says
    found = [str(w.message) for w in caught if any(text in str(w.message) for text in ALERT_TEXTS)]
    return found[0].splitlines()[0] if found else None


def distinct_results(call: Kept, reruns: int) -> int:
    """How many different results `reruns` runs of the call on fresh copies of its inputs give, under the
    flags it ran under in the step, each from the random state of the call (outputs and inputs after the run,
    as digests)."""
    seen = set()
    with _Rng(call) as rng, _Flags(call.deterministic, call.warn_only), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # warn_only alerts were counted by `alert`
        for _ in range(reruns):
            args, kwargs = _copy((call.args, call.kwargs))
            rng.reset()
            out = _results(call.func, call.func(*args, **kwargs))
            # an in-place or out= op writes into its inputs (a foreach op returns nothing): digest those too
            seen.add(_digests((out, args, kwargs) if call.func._schema.is_mutable else out))
    return len(seen)


def check_op(name: str, count: int, calls: list[Kept], reruns: int, over_budget: bool) -> AuditOpRecord:
    """The record of one op: PyTorch's alert and the re-runs of its kept calls, and the evidence in words."""
    if name in UNINITIALIZED:
        return AuditOpRecord(op=name, count=count, nondeterministic=None, evidence=(
            "not compared: its output is uninitialized memory (deterministic mode fills it when "
            "torch.utils.deterministic.fill_uninitialized_memory is on)"))
    if not calls:
        why = "inputs over the memory kept for re-runs" if over_budget else "no call could be kept"
        return AuditOpRecord(op=name, count=count, nondeterministic=None, evidence=f"not checked: {why}")
    alerts, distinct, errors = [], 0, []
    for call in calls:
        try:
            if text := alert(call):
                alerts.append(text)
            distinct = max(distinct, distinct_results(call, reruns))
        except Exception as exc:  # an op that cannot run outside its step (a collective, a custom op's state)
            errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    parts = []
    if alerts:
        parts.append(f"alert: {alerts[0]}")
    if distinct:
        random = torch.Tag.nondeterministic_seeded in getattr(calls[0].func, "tags", ())
        seeded = " (random op; generators restored to their state at the call before each run)" if random else ""
        parts.append(f"re-run: {distinct} distinct result{'s' if distinct > 1 else ''} in {reruns} "
                     f"(first {len(calls)} call{'s' if len(calls) > 1 else ''}){seeded}")
    if errors:
        parts.append(f"could not re-run: {errors[0]}")
    checked = bool(alerts) or distinct > 0
    nondet = (bool(alerts) or distinct > 1) if checked else None
    return AuditOpRecord(op=name, count=count, nondeterministic=nondet, alert=bool(alerts) if not errors else None,
                         distinct=distinct or None, reruns=reruns if distinct else 0,
                         evidence="; ".join(parts)[:EVIDENCE_CHARS])


def audit_step(step: Callable[[], None], reruns: int, calls_per_op: int) -> Iterator[AuditOpRecord]:
    """Every op one call of `step` runs, checked (see the module's docstring), most called first, one record
    as each op is checked."""
    counts, recorder = trace_step(step, calls_per_op)
    for name, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        yield check_op(name, count, recorder.kept.get(name, []), reruns, name in recorder.over_budget)
