"""How far two runs drift apart: per-tensor statistics and a count sketch of every recorded tensor (`cs1`).

A rank records per tensor, in float64: its sum, its L2 norm and max |x| (`stats`), and a sketch S(x) of
K numbers: every element goes, with a sign, into one of K buckets. Bucket and sign come from integer hashes
of the element's index and the tensor's index under a fixed seed, so every rank and every run uses the same
map and no random matrix is stored. S is linear, and the signs of two distinct elements are uncorrelated, so

    E ‖S(a) - S(b)‖² = ‖a - b‖²,   with a relative error of ‖S(a)-S(b)‖ about sqrt(2/K) per tensor

(the squared distance is a sum of K independent-ish terms; summed over many tensors that differ the error
shrinks further). The model-level estimate of two runs' relative distance at a step is

    sqrt(Σ_t ‖S_t(A) - S_t(B)‖²) / sqrt(Σ_t ‖A_t‖²)      (exact norms from the stats).

The map (`cs1`): a tensor's elements are read row-major as a matrix of COLUMNS columns (the last row padded
with zeros). Element i lies at row r = i // COLUMNS, column c = i % COLUMNS; column c has a bucket b1(c) and a
sign s1(c) from mix64(SEED ^ c); row r of tensor t has b2(t, r) and s2(t, r) from mix64(mix64(SEED + t) ^ r).
The element's bucket is (b1 + b2) mod K and its sign s1 * s2. Two distinct elements differ in their column
or their row, so their signs are uncorrelated whatever their buckets: the estimate is unbiased. It is a
matrix product with a COLUMNS × K signed one-hot matrix, then a rotation of each row's K sums: memory-bound
on a GPU, one float64 copy of the data in chunks (detlab.tensors.drift). Float64 accumulation keeps the
sketch's own rounding (~1e-16 relative) far below the differences it measures (1e-7 in fp32, 1e-3 in bf16).

Pure numpy: the reference that the torch implementation is tested against, the packing, and the estimator.
"""

from __future__ import annotations

import math

import numpy as np

VERSION = "cs1"
K = 16  # buckets per tensor: 128 bytes of sketch and 24 of stats per tensor, beside 16 of digest
COLUMNS = 4096
SEED = 0x6465746C61622D31  # b"detlab-1"
STATS = 3  # sum, L2 norm, max |x|
STAT_BYTES = 8 * STATS
SKETCH_BYTES = 8 * K
# A record's drift data is recorded for at most this many tensors (the digests take up to 65536): the record
# stays under the ingest body cap (8 MiB) with both as hex. Beyond it a rank records digests only.
MAX_TENSORS = 16384
RELATIVE_ERROR = math.sqrt(2 / K)  # of one tensor's distance estimate (one standard deviation, about)

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def mix64(x: np.ndarray | np.uint64) -> np.ndarray:
    """splitmix64's finaliser on uint64 (wrapping arithmetic)."""
    z = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _bucket_sign(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    bucket = (h & np.uint64(K - 1)).astype(np.int64)
    sign = 1.0 - 2.0 * ((h >> np.uint64(32)) & np.uint64(1)).astype(np.float64)
    return bucket, sign


def column_map(seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """(bucket, sign) of each of the COLUMNS columns."""
    return _bucket_sign(mix64(np.uint64(seed) ^ np.arange(COLUMNS, dtype=np.uint64)))


def row_map(tensor: int, rows: int, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """(bucket, sign) of each row of tensor number `tensor` (its index in the recorded list)."""
    with np.errstate(over="ignore"):
        base = mix64(np.uint64(seed) + np.uint64(tensor))
    return _bucket_sign(mix64(base ^ np.arange(rows, dtype=np.uint64)))


def rows_of(numel: int) -> int:
    return -(-numel // COLUMNS)


def sketch_reference(x: np.ndarray, tensor: int, seed: int = SEED) -> np.ndarray:
    """The K-bucket sketch of one tensor's elements (any dtype, read row-major as float64), element by element."""
    flat = np.asarray(x).reshape(-1).astype(np.float64)
    index = np.arange(flat.size)
    b1, s1 = column_map(seed)
    b2, s2 = row_map(tensor, rows_of(flat.size), seed)
    rows, cols = index // COLUMNS, index % COLUMNS
    out = np.zeros(K, dtype=np.float64)
    np.add.at(out, (b1[cols] + b2[rows]) % K, s1[cols] * s2[rows] * flat)
    return out


def stats_reference(x: np.ndarray) -> np.ndarray:
    """(sum, L2 norm, max |x|) in float64."""
    flat = np.asarray(x).reshape(-1).astype(np.float64)
    if not flat.size:
        return np.zeros(STATS)
    return np.array([flat.sum(), np.sqrt(np.dot(flat, flat)), np.abs(flat).max()])


# ---- packing: little-endian float64, tensor by tensor ----------------------------------------------------

def pack(values: np.ndarray) -> bytes:
    return np.ascontiguousarray(values, dtype="<f8").tobytes()


def unpack_stats(data: bytes) -> np.ndarray:
    """[tensors, 3]: sum, L2 norm, max |x|."""
    return np.frombuffer(data, dtype="<f8").reshape(-1, STATS)


def unpack_sketch(data: bytes) -> np.ndarray:
    """[tensors, K]."""
    return np.frombuffer(data, dtype="<f8").reshape(-1, K)


# ---- the estimator -----------------------------------------------------------------------------------------

def squared_distances(sketch_a: bytes, sketch_b: bytes) -> np.ndarray:
    """Per tensor: the estimate of ‖A_t - B_t‖² (unbiased; see the module's docstring)."""
    diff = unpack_sketch(sketch_a) - unpack_sketch(sketch_b)
    return np.einsum("tk,tk->t", diff, diff)


def relative_distance(stats_a: bytes, sketch_a: bytes, sketch_b: bytes) -> float | None:
    """Estimate of ‖A - B‖ / ‖A‖ over all tensors; None when A is all zeros (nothing to be relative to)."""
    norm_sq = float(np.square(unpack_stats(stats_a)[:, 1]).sum())
    if norm_sq <= 0.0:
        return None
    return math.sqrt(float(squared_distances(sketch_a, sketch_b).sum()) / norm_sq)


# One unit in the last place, relative (2^-mantissa bits): a difference below a few of these is rounding.
ROUNDING = {"float64": 2.0**-52, "float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}


def rounding_level(tensors: list[tuple[str, list[int], str]]) -> tuple[str, float] | None:
    """The dtype holding most of the recorded floating-point elements and its one-ulp relative level."""
    counts: dict[str, int] = {}
    for _name, shape, dtype in tensors:
        if dtype in ROUNDING:
            counts[dtype] = counts.get(dtype, 0) + math.prod(shape)
    if not counts:
        return None
    dtype = max(counts, key=lambda d: counts[d])
    return dtype, ROUNDING[dtype]
