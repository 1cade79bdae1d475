"""One rank of a `collective` run: timed, fingerprinted collectives on seeded inputs, checked against float64.

Launched like detlab.worker.ranks.train (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*):
`python -m detlab.worker.ranks.collective SPEC.json`, SPEC a RankSpec (detlab.core.wire) whose
`collective` says what to measure (ops, dtypes, sizes, trials, warmup).
gloo on CPU, nccl on CUDA (one process per GPU). What `bytes` means per op is in detlab.core.collective.

Inputs: element i of rank r is a counter-based hash of (seed, r, i) turned into ±(1 + m/2^23)·2^e with
e from three bands (2^7..2^10, 2^-2..2^1, 2^-9..2^-6) and both signs, so big terms cancel and small
ones are lost or kept depending on summation order (nccl-tests' inputs sum exactly in any order, which
hides reduction-order effects). The same values come from numpy (`input_values_np`) and torch
(`input_tensor`), so every rank computes the float64 reference of its outputs locally. reduce_scatter
lays its input out interleaved (block b, offset j holds element j·W + b) so a rank's leading output
elements are the same logical elements at every size.

Spool records: one `env`, then per (op, dtype, bytes, trial) a `trial` record (TrialRecord).
Errors are null when an output has more than `ref_max_elems` elements (default 2^22): the reference
needs every rank's inputs regenerated on the host, which does not scale to GiB messages.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from detlab.core.collective import DTYPE_BYTES, op_geometry
from detlab.core.wire import RankSpec, TrialRecord
from detlab.tensors import fingerprint as fp
from detlab.tensors.stack import apply_torch_flags, env_record
from detlab.worker.ranks import teardown
from detlab.worker.ranks.train import Spool, pick_device

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PRECISION = {"float32": 24, "bfloat16": 8, "float16": 11}  # significand bits
MIN_EXP = {"float32": -125, "bfloat16": -125, "float16": -13}  # frexp exponent of the smallest normal
GEN_CHUNK = 1 << 22
M32 = 0xFFFFFFFF
EXP_BANDS = (7, 7, -2, -9)  # by 2 hash bits: half the values large, a quarter medium, a quarter small
# torch 2.13 renamed the tensor variants (*_single); older releases only have the old names.
_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


# ---- inputs: the same bits from numpy int64 and torch int64 (no uint64 arithmetic in torch) -------------

def _mul32(x: Any, c: int) -> Any:
    # (x * c) mod 2^32 for x < 2^32 in two 16-bit halves, so int64 never overflows.
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & M32


def mix32(x: Any) -> Any:
    """A 32-bit integer hash (lowbias32); works on Python ints, numpy int64 arrays and torch int64 tensors."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _key(seed: int, rank: int) -> int:
    s = mix32((seed & M32) ^ 0x9E3779B9) ^ mix32(((seed >> 32) & M32) ^ 0x85EBCA6B)
    return int(mix32(s ^ mix32((rank + 0x27D4EB2F) & M32)))


def _parts(idx: Any, key: int) -> tuple[Any, Any, Any, Any]:
    """(sign ±1, exponent band 0..3, exponent offset 0..3, 23-bit mantissa) of each index."""
    h1 = mix32(idx ^ key)
    h2 = mix32(h1 ^ 0x165667B1)
    return 1 - 2 * (h1 & 1), (h1 >> 1) & 3, (h1 >> 3) & 3, h2 >> 9


def _bf16_np(x32: np.ndarray) -> np.ndarray:
    # round-to-nearest-even float32 -> bfloat16 (finite values), returned as float32
    bits = x32.view(np.uint32).astype(np.int64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def input_values_np(seed: int, rank: int, idx: np.ndarray, dtype: str) -> np.ndarray:
    """Rank `rank`'s input elements at indices `idx`, rounded to `dtype`, as float64 (the reference's view)."""
    sign, band, sub, mant = _parts(np.asarray(idx, dtype=np.int64), _key(seed, rank))
    exp = np.asarray(EXP_BANDS, dtype=np.int64)[band] + sub
    x32 = np.ldexp(sign * (1.0 + mant * 2.0**-23), exp).astype(np.float32)  # exact: 24 significant bits
    if dtype == "float16":
        return x32.astype(np.float16).astype(np.float64)
    return (_bf16_np(x32) if dtype == "bfloat16" else x32).astype(np.float64)


def input_tensor(seed: int, rank: int, n: int, dtype: str, device: torch.device,
                 via_numpy: bool | None = None) -> torch.Tensor:
    """Rank `rank`'s first `n` input elements in `dtype`, generated on `device` in bounded chunks.

    On CPU the numpy generator is used (faster); `via_numpy=False` forces the torch one (tests compare them).
    """
    out = torch.empty(n, dtype=TORCH_DTYPES[dtype], device=device)
    key = _key(seed, rank)
    bands = torch.tensor(EXP_BANDS, dtype=torch.int64, device=device)
    use_numpy = device.type == "cpu" if via_numpy is None else via_numpy  # numpy hashes faster on CPU
    for a in range(0, n, GEN_CHUNK):
        if use_numpy:
            vals = input_values_np(seed, rank, np.arange(a, min(n, a + GEN_CHUNK)), dtype)
            out[a : a + vals.size] = torch.from_numpy(vals.astype(np.float32)).to(out.dtype)  # exact: already rounded
            continue
        idx = torch.arange(a, min(n, a + GEN_CHUNK), dtype=torch.int64, device=device)
        sign, band, sub, mant = _parts(idx, key)
        x = torch.ldexp(sign.double() * (1.0 + mant.double() * 2.0**-23), bands[band] + sub)
        out[a : a + idx.numel()] = x.float().to(out.dtype)
    return out


# ---- float64 reference -------------------------------------------------------------------------------

def reference(op: str, seed: int, world: int, rank: int, dtype: str, count: int) -> np.ndarray:
    """Exact (float64) value of every output element of `rank`; sums of at most ~2^10 ranks are exact."""
    def total(idx: np.ndarray) -> np.ndarray:
        out = np.zeros(idx.size)
        for q in range(world):
            out += input_values_np(seed, q, idx, dtype)
        return out

    if op.startswith("all_reduce"):
        return total(np.arange(count)) / (world if op == "all_reduce_avg" else 1)
    if op == "reduce_scatter":
        return total(np.arange(count) * world + rank)
    if op == "all_gather":
        return np.concatenate([input_values_np(seed, q, np.arange(count), dtype) for q in range(world)])
    return input_values_np(seed, 0, np.arange(count), dtype)  # broadcast from rank 0


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """Correctly rounded (nearest-even) `dtype` value of float64 `x`, as float64."""
    if dtype == "float32":
        return x.astype(np.float32).astype(np.float64)
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float64)
    bits = x.view(np.uint64)  # bfloat16 keeps 7 of float64's 52 fraction bits; round once, from float64
    bits = (bits + np.uint64((1 << 44) - 1) + ((bits >> np.uint64(45)) & np.uint64(1))) & ~np.uint64((1 << 45) - 1)
    return bits.view(np.float64)


def ulp(x: np.ndarray, dtype: str) -> np.ndarray:
    """Spacing of `dtype` values at `x` (the subnormal spacing below the smallest normal)."""
    _, e = np.frexp(x)
    return np.ldexp(1.0, np.maximum(e, MIN_EXP[dtype]) - PRECISION[dtype])


def error_stats(out: torch.Tensor, ref: np.ndarray, dtype: str) -> tuple[float | None, float | None, float]:
    """(max |out - ref|, max that in ulps of dtype at the rounded ref, fraction not correctly rounded)."""
    got = out.detach().double().cpu().numpy().reshape(-1)
    rounded = round_to(ref, dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(got - ref)
        frac = float(np.count_nonzero(got != rounded)) / max(1, got.size)
        return _finite(diff.max(initial=0.0)), _finite((diff / ulp(rounded, dtype)).max(initial=0.0)), frac


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None  # JSON has no NaN/inf


# ---- one (op, dtype, bytes) cell ---------------------------------------------------------------------

class Cell:
    """Buffers and the call for one (op, dtype, bytes): `src` stays pristine; each trial copies it to `buf`."""

    def __init__(self, op: str, base: torch.Tensor, geo: dict[str, int], world: int, rank: int,
                 native: dict[str, bool], prefix_elems: int) -> None:
        self.op, self.world, self.rank = op, world, rank
        c = geo["count"]
        if op == "reduce_scatter":  # block b, offset j <- element j*world + b
            self.src = base[: c * world].view(c, world).t().contiguous().view(-1)
        else:
            self.src = base[: geo["in_elems"]]
        self.buf = torch.empty_like(self.src)
        self.out = self.buf
        self.call: Callable[[], None]
        self.impl = op
        if op == "all_reduce_sum":
            self.call, self.impl = lambda: dist.all_reduce(self.buf), "all_reduce"
        elif op == "all_reduce_avg" and native["avg"]:
            self.call, self.impl = lambda: dist.all_reduce(self.buf, op=dist.ReduceOp.AVG), "all_reduce"
        elif op == "all_reduce_avg":
            self.call, self.impl = self._sum_then_divide, "all_reduce(sum)/world_size"
        elif op == "all_gather":
            self.out = torch.empty(c * world, dtype=base.dtype, device=base.device)
            self.call, self.impl = lambda: _GATHER(self.out, self.buf), "all_gather"
        elif op == "reduce_scatter" and native["reduce_scatter"]:
            self.out = torch.empty(c, dtype=base.dtype, device=base.device)
            self.call, self.impl = lambda: _SCATTER(self.out, self.buf), "reduce_scatter"
        elif op == "reduce_scatter":
            self.out = self.buf.view(world, c)[rank]
            self.call, self.impl = lambda: dist.all_reduce(self.buf), "all_reduce+slice"
        elif op == "broadcast":
            self.call, self.impl = lambda: dist.broadcast(self.buf, src=0), "broadcast"
        k = prefix_elems // world if op in ("all_gather", "reduce_scatter") else prefix_elems
        self.prefix = self.out.view(world, c)[:, :k] if op == "all_gather" else self.out[:k]

    def _sum_then_divide(self) -> None:
        dist.all_reduce(self.buf)
        self.buf.div_(self.world)

    def trial(self, device: torch.device) -> float:
        """Run once on a fresh copy of the input; seconds (CUDA events on GPU, perf_counter on CPU)."""
        self.buf.copy_(self.src)
        dist.barrier()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.call()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        self.call()
        return time.perf_counter() - t0


def _native_support(backend: str) -> dict[str, bool]:
    """Whether this backend has AVG and reduce_scatter (older gloo lacks both); the fallbacks say so in `impl`."""
    if backend == "nccl":
        return {"avg": True, "reduce_scatter": True}
    world, found = dist.get_world_size(), {}
    for name, probe in (("avg", lambda: dist.all_reduce(torch.ones(1), op=dist.ReduceOp.AVG)),
                        ("reduce_scatter", lambda: _SCATTER(torch.empty(1), torch.ones(world)))):
        try:  # unsupported ops raise before any communication, on every rank alike
            probe()
            found[name] = True
        except (RuntimeError, ValueError, NotImplementedError):
            found[name] = False
    return found


# ---- the rank program ------------------------------------------------------------------------------

def _trial_record(cell: Cell, dtype: str, nbytes: int, geo: dict[str, int], trial: int, seconds: float,
                  digests: list[str], errors: tuple[float | None, float | None, float | None]) -> TrialRecord:
    return TrialRecord.model_validate({
        "op": cell.op, "dtype": dtype, "bytes": nbytes, "count": geo["count"], "op_bytes": geo["op_bytes"],
        "world_size": cell.world, "trial": trial, "rank": cell.rank, "digest": digests[0],
        "prefix_digest": digests[1], "fp_version": fp.FP_VERSION, "time_s": seconds, "err_max_abs": errors[0],
        "err_max_ulp": errors[1], "frac_diff": errors[2], "impl": cell.impl})


def run(spec: RankSpec, *, finalize: bool = True) -> list[TrialRecord]:
    """Run every (op, dtype, size) cell on this rank; appends to the spool and returns the trial records."""
    p = spec.collective
    if p is None:
        raise ValueError("a collective rank needs `collective` in its spec")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if spec.threads:
        torch.set_num_threads(spec.threads)
    if spec.torch:
        apply_torch_flags(spec.torch)
    seed = spec.seed
    device = pick_device(spec.device, int(os.environ.get("LOCAL_RANK", rank)))
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        if device.type == "cuda":  # device_id: NCCL binds this GPU now and barrier() knows it
            dist.init_process_group(backend, rank=rank, world_size=world, device_id=device)
        else:
            dist.init_process_group(backend, rank=rank, world_size=world)
    spool = Spool(Path(spec.spool_dir) / f"rank{rank}.jsonl") if spec.spool_dir else None
    if spool:
        spool.write(env_record(rank, device, backend))
    native, records = _native_support(backend), []
    for dtype in p.dtypes:
        prefix_elems = p.sizes[0] // DTYPE_BYTES[dtype]
        base = input_tensor(seed, rank, p.sizes[-1] // DTYPE_BYTES[dtype], dtype, device)
        for op in p.ops:
            for nbytes in p.sizes:
                geo = op_geometry(op, nbytes, dtype, world)
                cell = Cell(op, base, geo, world, rank, native, prefix_elems)
                for _ in range(p.warmup):
                    cell.trial(device)
                ref = (reference(op, seed, world, rank, dtype, geo["count"])
                       if cell.out.numel() <= spec.ref_max_elems else None)
                seen: dict[str, tuple[float | None, float | None, float | None]] = {}
                for t in range(p.trials):
                    seconds = cell.trial(device)
                    digests = fp.fingerprint_many([cell.out, cell.prefix])
                    if digests[0] not in seen:  # same bits, same errors
                        seen[digests[0]] = error_stats(cell.out, ref, dtype) if ref is not None else (None,) * 3
                    rec = _trial_record(cell, dtype, nbytes, geo, t, seconds, digests, seen[digests[0]])
                    records.append(rec)
                    if spool:
                        spool.write(rec)
                del cell
        del base
    if finalize:
        teardown.leave()  # every rank done, then the group torn down (worker/ranks/teardown.py)
    else:
        dist.barrier()
    return records


def main() -> None:
    run(RankSpec.model_validate_json(Path(sys.argv[1]).read_text()))


if __name__ == "__main__":
    main()
