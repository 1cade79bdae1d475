"""Fingerprints (fp2, and fp1 on request): reference vectors, cross-implementation equality, change detection."""

from __future__ import annotations

import hashlib
import importlib.util
import math
import random
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from detlab.tensors.fingerprint import (
    FP1_KEY,
    FP2_KEY,
    FP_VERSION,
    PUBLIC_KEYS,
    DigestKey,
    bytes_to_digest,
    certificate,
    digest_to_bytes,
    digests_to_bytes,
    fingerprint,
    fingerprint_bytes,
    fingerprint_many,
    implementation_name,
    tensor_bytes,
)
from detlab.tensors.fingerprint.reference import lane_sums_np
from detlab.tensors.fingerprint.torch_impl import fingerprint_torch, lane_sums_words
from tests.tensors.interpreter import interpreted, needs_triton

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")

# (label, tensor builder, hex of its logical bytes, fp1 digest, fp2 digest). The same table is in
# docs/fingerprint.md.
TABLE: list[tuple[str, Callable[[], torch.Tensor], str, str, str]] = [
    ("float32 empty []", lambda: torch.empty(0, dtype=torch.float32),
     "", "fp1:83cd62b96d17d778a1acb9efa2e8d674", "fp2:58ebc13ba0e1821d680823ff123dc0a1"),
    ("float32 [1.0, -0.0, inf, nan]", lambda: torch.tensor([1.0, -0.0, math.inf, math.nan]),
     "0000803f000000800000807f0000c07f",
     "fp1:87a8937b7366a1136c81eaa0ca7c6f83", "fp2:e7a7eba7080d5c9fb37e247d44d9b7c9"),
    ("float32 [1.0, 0.0, inf, nan]", lambda: torch.tensor([1.0, 0.0, math.inf, math.nan]),
     "0000803f000000000000807f0000c07f",
     "fp1:417855aa8a38c6d58bbd396443128893", "fp2:67378e70fee831999b25a3e2f1f2e74e"),
    ("float32 0-d 3.5", lambda: torch.tensor(3.5),
     "00006040", "fp1:d6c239094aee78aeef34d81a7ce208b1", "fp2:a9aed87ee94743aa619467012d755ad5"),
    ("float32 arange(12).reshape(3, 4).t()", lambda: torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),
     "0000000000008040000000410000803f0000a04000001041000000400000c04000002041000040400000e04000003041",
     "fp1:fdd9d74d9d17f3e996eab6722371ab45", "fp2:5ad57f25e0cdaf466585c682ae453bec"),
    ("float16 [1.0, -2.0, 65504.0]", lambda: torch.tensor([1.0, -2.0, 65504.0], dtype=torch.float16),
     "003c00c0ff7b", "fp1:3d9c9816eca165e957e9d223a61921ef", "fp2:8717fb4eaf1a217eb687cc70a9dcae9f"),
    ("bfloat16 [1.0, -0.0, 3.140625, 1e38, -1.5]",
     lambda: torch.tensor([1.0, -0.0, 3.140625, 1e38, -1.5], dtype=torch.bfloat16),
     "803f00804940967ec0bf", "fp1:b4b73eaaa59d7c32960ac5060025902a", "fp2:90a2519da2ae811c9b74267dc684ece4"),
    ("float64 [pi, -1e-300, -0.0]", lambda: torch.tensor([math.pi, -1e-300, -0.0], dtype=torch.float64),
     "182d4454fb21094059f3f8c21f6ea5810000000000000080",
     "fp1:fd84a1cff1c5fea9f7c52412b611497c", "fp2:5222fc02cfb15fb3b1505490c3017f00"),
    ("float8_e4m3fn [0.5, -448.0, 1.0]", lambda: torch.tensor([0.5, -448.0, 1.0]).to(torch.float8_e4m3fn),
     "30fe38", "fp1:254e2c5660d224758dad09de81b4281f", "fp2:0875d1d5fbf1f228b12aae8954bac5fc"),
    ("float8_e5m2 [0.5, -57344.0, 1.0, 2.0]",
     lambda: torch.tensor([0.5, -57344.0, 1.0, 2.0]).to(torch.float8_e5m2),
     "38fb3c40", "fp1:d32fcebd5fac2f3b315c86291268c305", "fp2:93873e7c634c41a05642165700a928bc"),
    ("int8 [-128, -1, 0, 1, 127]", lambda: torch.tensor([-128, -1, 0, 1, 127], dtype=torch.int8),
     "80ff00017f", "fp1:321ddbd4ffff5143f16fd006e6a7068c", "fp2:5605ac652a51b71aa359c03fa5e0ca43"),
    ("int16 [-32768, -1, 0, 32767]", lambda: torch.tensor([-32768, -1, 0, 32767], dtype=torch.int16),
     "0080ffff0000ff7f", "fp1:7b4aee158bbf61064bdd3255f8a90ec0", "fp2:84686dbcde7cd4fc37d688a1650c9547"),
    ("int32 [-2**31, -1, 0, 2**31 - 1, 7]",
     lambda: torch.tensor([-(2**31), -1, 0, 2**31 - 1, 7], dtype=torch.int32),
     "00000080ffffffff00000000ffffff7f07000000",
     "fp1:40f0248972383eb1ecd873a9c33c4385", "fp2:891941b34992e9abbc5da84d342667cd"),
    ("int64 [-2**63, -1, 0, 2**63 - 1]",
     lambda: torch.tensor([-(2**63), -1, 0, 2**63 - 1], dtype=torch.int64),
     "0000000000000080ffffffffffffffff0000000000000000ffffffffffffff7f",
     "fp1:d837fac7ea072bb0cb36c978c9aa120c", "fp2:692f608c941a4e3487023c95044522d2"),
    ("uint8 [1, 2, 3]", lambda: torch.tensor([1, 2, 3], dtype=torch.uint8),
     "010203", "fp1:f12e9063f5ea17ad7b443191bcccdd24", "fp2:8850d4aa3b5b1aab90fc85ce859990c8"),
    ("uint8 [1, 2, 3, 0]", lambda: torch.tensor([1, 2, 3, 0], dtype=torch.uint8),
     "01020300", "fp1:2803d4cca7da4cffc9f95a5d0d330cab", "fp2:efd4ceb837e9cf31193d5fcbcaced762"),
    ("uint8 arange(17)", lambda: torch.arange(17, dtype=torch.uint8),
     "000102030405060708090a0b0c0d0e0f10",
     "fp1:6ab332a4b452d65ef2c97368377d38d9", "fp2:ff25a698fe3a76529a44a4b568fae17e"),
    ("bool [True, False, True]", lambda: torch.tensor([True, False, True]),
     "010001", "fp1:f3a494c8ec20cd48c2b072c02677c75f", "fp2:28db8ab618d70d6ff24a58681e259a2c"),
    ("complex64 [1+2j, -0.5-0j]", lambda: torch.tensor([1 + 2j, complex(-0.5, -0.0)], dtype=torch.complex64),
     "0000803f00000040000000bf00000080",
     "fp1:f4de4d5648444f2b6dc6391064a6253f", "fp2:f70f0ee335f8b550f91c42bd0d99a552"),
]  # fmt: skip
# One vector per row and version: (label, builder, hex, digest), the digest's prefix naming its version.
VECTORS = [(f"{label} {d.split(':')[0]}", build, hexs, d) for label, build, hexs, *ds in TABLE for d in ds]
VECTOR_IDS = [v[0] for v in VECTORS]

DTYPES = [
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64,
]  # fmt: skip
SIZES = [0, 1, 3, 7, 8, 9, 1000, 4097]


def random_tensor(dtype: torch.dtype, numel: int, seed: int = 0, device: str = "cpu") -> torch.Tensor:
    """Random raw bytes viewed as `dtype`, so NaN payloads, subnormals and -0.0 all turn up."""
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=gen).bool().to(device)
    esize = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (numel * esize,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).to(device)


PUBLIC_CONSTANTS = ((0x9E3779B97F4A7C15, 0xD1B54A32D192ED03), (0, 0), (0x6A09E667F3BCC908, 0xBB67AE8584CAA73B))
# The mixers of each version as docs/fingerprint.md lists them: (s1, m1, s2, m2, s3) for lane 0, then lane 1.
SPEC_MIXERS = {
    "fp1": ((30, 0xBF58476D1CE4E5B9, 27, 0x94D049BB133111EB, 31), (33, 0xFF51AFD7ED558CCD, 33, 0xC4CEB9FE1A85EC53, 33)),
    "fp2": ((32, 0x4CD6944C5CC20B6D, 29, 0xFC12C5B19D3259E9, 32), (32, 0xFF51AFD7ED558CCD, 29, 0xC4CEB9FE1A85EC53, 32)),
}  # fmt: skip


def spec_digest(data: bytes, constants: tuple = PUBLIC_CONSTANTS, prefix: str = FP_VERSION) -> str:
    """The algorithm written straight from docs/fingerprint.md in Python ints: an independent check of
    reference.py. `constants` = (G, P, F) per lane; a keyed digest is the same algorithm with secret ones;
    the version (the prefix before any "-keyed") picks the mixers."""
    m64 = (1 << 64) - 1
    (g0, g1), (p0, p1), (f0, f1) = constants

    def mix(z: int, s1: int, m1: int, s2: int, m2: int, s3: int) -> int:
        z = ((z ^ (z >> s1)) * m1) & m64
        z = ((z ^ (z >> s2)) * m2) & m64
        return z ^ (z >> s3)

    mix0, mix1 = SPEC_MIXERS[prefix.removesuffix("-keyed")]
    padded = data + bytes(-len(data) % 8)
    s0 = s1 = 0
    for j in range(len(padded) // 8):
        u = int.from_bytes(padded[8 * j : 8 * j + 8], "little")
        s0 = (s0 + mix(u ^ ((j * g0 + p0) & m64), *mix0)) & m64
        s1 = (s1 + mix(u ^ ((j * g1 + p1) & m64), *mix1)) & m64
    h0 = mix(s0 ^ mix(len(data) ^ f0, *mix0), *mix0)
    h1 = mix(s1 ^ mix(len(data) ^ f1, *mix1), *mix1)
    return f"{prefix}:{h0:016x}{h1:016x}"


def key_of(digest: str) -> DigestKey:
    """The public key of the version a digest names."""
    return PUBLIC_KEYS[digest.split(":")[0]]


def flip_bit(t: torch.Tensor, bit: int) -> torch.Tensor:
    raw = bytearray(tensor_bytes(t))
    raw[bit // 8] ^= 1 << (bit % 8)
    return torch.frombuffer(raw, dtype=torch.uint8).clone().view(t.dtype).reshape(t.shape)


# --- reference vectors --------------------------------------------------------------------------------


@pytest.mark.parametrize(("label", "build", "hex_bytes", "digest"), VECTORS, ids=VECTOR_IDS)
def test_reference_matches_vector(label: str, build: Callable, hex_bytes: str, digest: str) -> None:
    assert fingerprint_bytes(bytes.fromhex(hex_bytes), key=key_of(digest)) == digest


@pytest.mark.parametrize(("label", "build", "hex_bytes", "digest"), VECTORS, ids=VECTOR_IDS)
def test_documented_spec_matches_vector(label: str, build: Callable, hex_bytes: str, digest: str) -> None:
    assert spec_digest(bytes.fromhex(hex_bytes), prefix=digest.split(":")[0]) == digest


@pytest.mark.parametrize(("label", "build", "hex_bytes", "digest"), VECTORS, ids=VECTOR_IDS)
def test_vector_tensor_has_the_listed_bytes(label: str, build: Callable, hex_bytes: str, digest: str) -> None:
    assert tensor_bytes(build()).hex() == hex_bytes


@pytest.mark.parametrize(("label", "build", "hex_bytes", "digest"), VECTORS, ids=VECTOR_IDS)
def test_torch_cpu_matches_vector(label: str, build: Callable, hex_bytes: str, digest: str) -> None:
    assert fingerprint_torch(build(), key=key_of(digest)) == digest


@pytest.mark.parametrize(("label", "build", "hex_bytes", "digest"), VECTORS, ids=VECTOR_IDS)
def test_fingerprint_matches_vector(label: str, build: Callable, hex_bytes: str, digest: str) -> None:
    assert fingerprint(build(), key=key_of(digest)) == digest


# --- cross-implementation equality ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_cpu_matches_reference_on_random_tensors(dtype: torch.dtype) -> None:
    for seed, numel in enumerate(SIZES):
        t = random_tensor(dtype, numel, seed)
        assert fingerprint_torch(t) == fingerprint_bytes(tensor_bytes(t)), (dtype, numel)


# --- the compiled CPU kernel (numba; skipped where numba is not installed) -------------------------------


def numba_kernel() -> Any:
    pytest.importorskip("numba")
    from detlab.tensors.fingerprint import cpu_impl

    return cpu_impl


@pytest.mark.parametrize(("label", "build", "hex_bytes", "digest"), VECTORS, ids=VECTOR_IDS)
def test_numba_cpu_matches_vector(label: str, build: Callable, hex_bytes: str, digest: str) -> None:
    assert numba_kernel().fingerprint_cpu(build(), key=key_of(digest)) == digest


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_numba_cpu_matches_reference_on_random_tensors(dtype: torch.dtype) -> None:
    cpu = numba_kernel()
    for seed, numel in enumerate(SIZES):
        t = random_tensor(dtype, numel, seed)
        assert cpu.fingerprint_cpu(t) == fingerprint_bytes(tensor_bytes(t)), (dtype, numel)
        assert cpu.fingerprint_cpu(t, key=KEY) == fingerprint_bytes(tensor_bytes(t), key=KEY), (dtype, numel)


def test_numba_cpu_pieces_on_threads_do_not_change_the_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = numba_kernel()
    monkeypatch.setattr(cpu, "PIECE_WORDS", 7)  # 1001 words: 143 pieces over the pool's threads
    t = random_tensor(torch.float64, 1001, seed=9)
    assert cpu.fingerprint_cpu(t) == fingerprint_bytes(tensor_bytes(t))


def test_numba_cpu_reads_a_view_that_starts_mid_word() -> None:
    t = random_tensor(torch.uint8, 1003, seed=10)[3:]
    assert numba_kernel().fingerprint_cpu(t) == fingerprint_bytes(tensor_bytes(t))


@pytest.mark.parametrize("first_pos", [2**32 - 3, 2**63 - 2, 2**64 - 3])
def test_numba_cpu_and_reference_agree_at_large_word_positions(first_pos: int) -> None:
    words = random_tensor(torch.int64, 64, seed=6).numpy().view(np.uint64)
    assert numba_kernel().lane_sums_words(words, first_pos) == lane_sums_np(words, first_pos)


def test_without_numba_the_cpu_falls_back_to_torch_with_the_same_digests(monkeypatch: pytest.MonkeyPatch) -> None:
    tensors = [random_tensor(d, 33, seed=i) for i, d in enumerate(DTYPES)]
    compiled = fingerprint_many(tensors)
    monkeypatch.setenv("DETLAB_FP_NUMBA", "0")
    assert implementation_name("cpu") == "torch-cpu"
    assert fingerprint_many(tensors) == compiled


def test_spec_matches_reference_on_random_bytes() -> None:
    rng = random.Random(5)
    for n in [0, 1, 5, 8, 15, 16, 17, 100, 1001]:
        data = rng.randbytes(n)
        assert spec_digest(data) == fingerprint_bytes(data), n


def test_torch_chunking_does_not_change_the_digest() -> None:
    t = random_tensor(torch.float32, 1001, seed=3)
    assert fingerprint_torch(t, chunk_words=7) == fingerprint_bytes(tensor_bytes(t))


def test_reference_chunking_does_not_change_the_digest() -> None:
    data = random.Random(4).randbytes(8 * 1000 + 3)
    assert fingerprint_bytes(data, chunk_words=13) == fingerprint_bytes(data)


@pytest.mark.parametrize("first_pos", [2**31 - 3, 2**32 - 3, 2**40 + 1, 2**63 - 2, 2**64 - 3])
def test_torch_and_reference_agree_at_large_word_positions(first_pos: int) -> None:
    words = random_tensor(torch.int64, 64, seed=6)
    expected = lane_sums_np(words.numpy().view(np.uint64), first_pos)
    got = tuple(int(v) & ((1 << 64) - 1) for v in lane_sums_words(words, first_pos).tolist())
    assert got == expected


def test_fingerprint_many_matches_fingerprint() -> None:
    tensors = [random_tensor(d, 33, seed=i) for i, d in enumerate(DTYPES)]
    assert fingerprint_many(tensors) == [fingerprint(t) for t in tensors]


def test_implementation_name_on_cpu() -> None:
    want = "numba-cpu" if importlib.util.find_spec("numba") else "torch-cpu"
    assert implementation_name("cpu") == want
    assert implementation_name(torch.device("cpu")) == want


# --- change detection -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "numel"),
    [(torch.float32, 16), (torch.float64, 8), (torch.bfloat16, 16), (torch.uint8, 7)],
    ids=str,
)
def test_every_single_bit_flip_gives_a_distinct_digest(dtype: torch.dtype, numel: int) -> None:
    t = random_tensor(dtype, numel, seed=7)
    nbits = numel * t.element_size() * 8
    digests = {fingerprint(t)} | {fingerprint(flip_bit(t, b)) for b in range(nbits)}
    assert len(digests) == nbits + 1


def test_random_bit_flips_on_a_large_tensor_change_the_digest() -> None:
    t = random_tensor(torch.float32, 1 << 20, seed=8)
    rng = random.Random(8)
    digests = {fingerprint(t)}
    for _ in range(10):
        bit = rng.randrange(t.numel() * 32)
        flipped = t.clone()
        flipped.view(torch.uint8)[bit // 8] ^= 1 << (bit % 8)
        digests.add(fingerprint(flipped))
    assert len(digests) == 11


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.complex64], ids=str)
def test_replacing_one_8_byte_element_changes_the_digest(dtype: torch.dtype) -> None:
    t = random_tensor(dtype, 64, seed=9)
    base = fingerprint(t)
    for i in range(200):
        changed = t.clone()
        changed.view(torch.int64)[i % 64] = random_tensor(torch.int64, 1, seed=100 + i)[0]
        if torch.equal(changed.view(torch.int64), t.view(torch.int64)):
            continue
        assert fingerprint(changed) != base, i


def test_swapping_two_elements_changes_the_digest() -> None:
    t = torch.arange(10, dtype=torch.float32)
    swapped = t.clone()
    swapped[[2, 7]] = swapped[[7, 2]]
    assert fingerprint(swapped) != fingerprint(t)


def test_swapping_neighbours_inside_one_word_changes_the_digest() -> None:
    t = torch.tensor([1, 2, 3, 4], dtype=torch.int16)
    assert fingerprint(torch.tensor([2, 1, 3, 4], dtype=torch.int16)) != fingerprint(t)


def test_negative_zero_differs_from_zero() -> None:
    assert fingerprint(torch.tensor([-0.0])) != fingerprint(torch.tensor([0.0]))


def test_nan_payloads_differ() -> None:
    quiet = torch.tensor([0x7FC00000], dtype=torch.int32).view(torch.float32)
    payload = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    assert quiet.isnan().item() and payload.isnan().item()
    assert fingerprint(quiet) != fingerprint(payload)


def three_word_collision(base: torch.Tensor, positions: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Two tensors shaped like `base` that differ in three 8-byte words and have the same fp1 and fp2 digest, built
    from the spec's formulas with no search (see "Known collisions" in docs/fingerprint.md).

    A lane sum depends only on the lane's multiset of keys `u_j XOR (j * G_k)`. Words x, y, z at positions
    a, b, c are replaced by x', y', z' so that lane 0's keys rotate one way (new key at a = old key at b,
    b <- c, c <- a) and lane 1's the other way (a <- c, b <- a, c <- b). Six XOR equations, consistent for
    any positions: x is base's word at a, everything else follows.
    """
    m64 = (1 << 64) - 1
    a, b, c = positions
    a0, b0, c0 = ((p * 0x9E3779B97F4A7C15) & m64 for p in positions)
    a1, b1, c1 = ((p * 0xD1B54A32D192ED03) & m64 for p in positions)
    raw = bytearray(tensor_bytes(base))

    def put(data: bytearray, j: int, word: int) -> None:
        data[8 * j : 8 * j + 8] = word.to_bytes(8, "little")

    x = int.from_bytes(raw[8 * a : 8 * a + 8], "little")
    y, z = x ^ a0 ^ c0 ^ b1 ^ c1, x ^ b0 ^ c0 ^ a1 ^ b1
    put(raw, b, y)
    put(raw, c, z)
    other = bytearray(raw)
    for j, word in ((a, y ^ a0 ^ b0), (b, z ^ b0 ^ c0), (c, x ^ a0 ^ c0)):
        put(other, j, word)

    def build(data: bytearray) -> torch.Tensor:
        return torch.frombuffer(data, dtype=torch.uint8).clone().view(base.dtype).reshape(base.shape)

    return build(raw), build(other)


@pytest.mark.parametrize("positions", [(0, 1, 2), (3, 10, 41), (5, 4, 1000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_three_words_rotated_in_key_space_collide_under_public_keys(dtype: torch.dtype, positions: tuple) -> None:
    a, b = three_word_collision(random_tensor(dtype, 8192 // torch.empty(0, dtype=dtype).element_size(), 30),
                                positions)
    words_a, words_b = (np.frombuffer(tensor_bytes(t), dtype="<u8") for t in (a, b))
    assert np.flatnonzero(words_a != words_b).tolist() == sorted(positions)
    for version, key in PUBLIC_KEYS.items():  # the multisets of keys are equal: no mixer can tell them apart
        assert fingerprint(a, key=key) == fingerprint(b, key=key)
        assert spec_digest(tensor_bytes(a), prefix=version) == spec_digest(tensor_bytes(b), prefix=version)
    assert certificate(a) != certificate(b)


# --- keyed digests (detlab diff) --------------------------------------------------------------------------

# A fixed key, so that failures reproduce; DigestKey.random() is what `detlab diff` uses.
KEY_CONSTANTS = ((0x3C6EF372FE94F82B, 0xA54FF53A5F1D36F1), (0x510E527FADE682D1, 0x9B05688C2B3E6C1F),
                 (0x1F83D9ABFB41BD6B, 0x5BE0CD19137E2179))  # fmt: skip
KEY = DigestKey(*KEY_CONSTANTS)
KEY_FP1 = DigestKey(*KEY_CONSTANTS, version="fp1")


def test_public_keys_are_their_versions() -> None:
    t = random_tensor(torch.bfloat16, 1001, 31)
    assert fingerprint(t, key=FP2_KEY) == fingerprint(t) == fingerprint_bytes(tensor_bytes(t))
    assert spec_digest(tensor_bytes(t)) == fingerprint(t)
    assert fingerprint(t, key=FP1_KEY) == fingerprint_bytes(tensor_bytes(t), key=FP1_KEY)
    assert spec_digest(tensor_bytes(t), prefix="fp1") == fingerprint(t, key=FP1_KEY)
    assert fingerprint(t, key=FP1_KEY)[4:] != fingerprint(t)[4:]


def test_versions_differ_in_their_mixers_alone() -> None:
    assert (FP1_KEY.pos_mul, FP1_KEY.pos_add, FP1_KEY.len_key) == (FP2_KEY.pos_mul, FP2_KEY.pos_add, FP2_KEY.len_key)
    assert {v: PUBLIC_KEYS[v].mixers for v in PUBLIC_KEYS} == SPEC_MIXERS


@pytest.mark.parametrize("version", list(SPEC_MIXERS))
def test_each_mixer_is_a_bijection_with_full_avalanche(version: str) -> None:
    """The proofs need bijective mixers (odd multipliers, shifts in 1..63); change detection beyond them rests
    on mixing: flipping any one input bit flips each output bit in about half of 2^14 random inputs."""
    from detlab.tensors.fingerprint.reference import _mix_np

    rng = np.random.default_rng(38)
    x = rng.integers(0, 2**64, 1 << 14, dtype=np.uint64)
    for mixer in SPEC_MIXERS[version]:
        s1, m1, s2, m2, s3 = mixer
        assert m1 & 1 and m2 & 1 and all(0 < s < 64 for s in (s1, s2, s3))
        h = _mix_np(x.copy(), mixer)
        assert len(np.unique(h)) == len(np.unique(x))
        for bit in range(64):
            flipped = h ^ _mix_np(x ^ np.uint64(1 << bit), mixer)
            rate = np.unpackbits(flipped.view(np.uint8).reshape(-1, 8), axis=1).mean(axis=0)
            assert np.all(np.abs(rate - 0.5) < 0.02), (mixer, bit)  # 6.5 sigma of sampling noise


def test_keyed_reference_matches_the_spec_transcription() -> None:
    rng = random.Random(32)
    for n in [0, 1, 7, 8, 9, 100, 1001]:
        data = rng.randbytes(n)
        assert fingerprint_bytes(data, key=KEY) == spec_digest(data, KEY_CONSTANTS, "fp2-keyed"), n
        assert fingerprint_bytes(data, key=KEY_FP1) == spec_digest(data, KEY_CONSTANTS, "fp1-keyed"), n


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_keyed_torch_matches_keyed_reference(dtype: torch.dtype) -> None:
    for seed, numel in enumerate(SIZES):
        t = random_tensor(dtype, numel, seed)
        assert fingerprint(t, key=KEY) == fingerprint_bytes(tensor_bytes(t), key=KEY), (dtype, numel)
    t = random_tensor(dtype, 1001, 33)
    assert fingerprint_torch(t, chunk_words=7, key=KEY) == fingerprint_bytes(tensor_bytes(t), chunk_words=5, key=KEY)
    view = random_tensor(dtype, 40, 34)[1::3]
    assert fingerprint_many([view, t], key=KEY) == [fingerprint(dense_copy(view), key=KEY), fingerprint(t, key=KEY)]


def test_keyed_digest_is_marked_and_depends_on_the_key() -> None:
    t = random_tensor(torch.float32, 100, 35)
    digests = {fingerprint(t, key=k) for k in (KEY, KEY_FP1, DigestKey.random(), DigestKey.random(), FP2_KEY)}
    assert len(digests) == 5
    assert re.fullmatch(r"fp2-keyed:[0-9a-f]{32}", fingerprint(t, key=KEY))
    assert re.fullmatch(r"fp1-keyed:[0-9a-f]{32}", fingerprint(t, key=KEY_FP1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_random_keys_tell_the_public_colliding_pair_apart(dtype: torch.dtype) -> None:
    a, b = three_word_collision(random_tensor(dtype, 512, 36), (3, 10, 41))
    assert fingerprint(a) == fingerprint(b)
    for key in [KEY] + [DigestKey.random() for _ in range(20)]:
        assert fingerprint(a, key=key) != fingerprint(b, key=key)


def test_keyed_every_single_bit_flip_gives_a_distinct_digest() -> None:
    t = random_tensor(torch.float32, 16, 37)
    digests = {fingerprint(t, key=KEY)} | {fingerprint(flip_bit(t, b), key=KEY) for b in range(16 * 32)}
    assert len(digests) == 16 * 32 + 1


def test_random_keys_are_fresh_with_odd_multipliers() -> None:
    keys = [DigestKey.random() for _ in range(50)]
    assert len(set(keys)) == 50
    assert all(m & 1 for k in keys for m in k.pos_mul)
    assert "pos_mul" not in repr(keys[0])  # a key printed in a log or traceback is no longer secret


@pytest.mark.parametrize("bad", [{"pos_mul": (2, 3)}, {"pos_add": (1 << 64, 0)}, {"len_key": (-1, 0)},
                                 {"version": "fp3"}])
def test_digest_key_rejects_invalid_constants(bad: dict) -> None:
    fields: dict = dict(zip(("pos_mul", "pos_add", "len_key"), KEY_CONSTANTS, strict=True)) | bad
    with pytest.raises(ValueError):
        DigestKey(**fields)


def test_trailing_zero_byte_changes_the_digest() -> None:
    three = torch.tensor([1, 2, 3], dtype=torch.uint8)
    four = torch.tensor([1, 2, 3, 0], dtype=torch.uint8)
    assert fingerprint(three) != fingerprint(four)


def test_zero_padding_to_a_full_word_changes_the_digest() -> None:
    assert fingerprint_bytes(b"\x01" * 7) != fingerprint_bytes(b"\x01" * 7 + b"\x00")
    assert fingerprint_bytes(b"") != fingerprint_bytes(b"\x00")


# --- layouts, shapes, edge cases -----------------------------------------------------------------------

VIEWS: dict[str, Callable[[], torch.Tensor]] = {
    "transpose": lambda: random_tensor(torch.float32, 35, 1).reshape(5, 7).t(),
    "step slice": lambda: random_tensor(torch.float64, 40, 2)[::3],
    "expand (stride 0)": lambda: random_tensor(torch.int16, 3, 3).reshape(3, 1).expand(3, 5),
    "uint8 offset 1": lambda: random_tensor(torch.uint8, 40, 4)[1:],
    "bf16 offset 3": lambda: random_tensor(torch.bfloat16, 40, 5)[3:],
    "permute 3d": lambda: random_tensor(torch.float16, 60, 6).reshape(3, 4, 5).permute(2, 0, 1),
    "column of complex": lambda: random_tensor(torch.complex64, 12, 7).reshape(4, 3)[:, 1],
    "conj view": lambda: random_tensor(torch.complex64, 9, 8).conj(),
    "requires grad": lambda: torch.randn(5, 5, requires_grad=True).t(),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_non_contiguous_view_matches_its_contiguous_copy(name: str) -> None:
    view = VIEWS[name]()
    copy = view.detach().resolve_conj().contiguous().clone()
    assert fingerprint(view) == fingerprint(copy) == fingerprint_bytes(tensor_bytes(copy))


def test_conj_view_hashes_the_conjugated_values() -> None:
    z = torch.tensor([1 + 2j], dtype=torch.complex64)
    assert fingerprint(z.conj()) == fingerprint(torch.tensor([1 - 2j], dtype=torch.complex64))


def test_zero_dim_tensor_hashes_its_single_element() -> None:
    assert fingerprint(torch.tensor(2.5)) == fingerprint_bytes(np.float32(2.5).tobytes())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_tensors_hash_like_empty_bytes(dtype: torch.dtype) -> None:
    assert fingerprint(torch.empty(0, 3, dtype=dtype)) == fingerprint_bytes(b"")


def test_sparse_tensor_is_refused_with_a_hint() -> None:
    with pytest.raises(TypeError, match="to_dense"):
        fingerprint(torch.eye(3).to_sparse())


def dense_copy(view: torch.Tensor) -> torch.Tensor:
    """A fresh tensor with row-major strides and the view's logical values (conj/neg resolved by copy_)."""
    return torch.empty(view.shape, dtype=view.dtype).copy_(view)


# One element at a stride other than 1: `contiguous()` keeps such a tensor as it is (a dimension of size 1
# may have any stride), so its bytes cannot be reinterpreted with `view(torch.uint8)`.
ONE_ELEMENT_VIEWS: dict[str, Callable[[str], torch.Tensor]] = {
    "[::2] of 2": lambda dev: random_tensor(torch.float32, 2, 20, dev)[::2],
    "t()[2:3] of (1, 5)": lambda dev: random_tensor(torch.float32, 5, 21, dev).reshape(1, 5).t()[2:3],
    "bf16 column [2:3, 1]": lambda dev: random_tensor(torch.bfloat16, 12, 22, dev).reshape(4, 3)[2:3, 1],
    "float64 [1::7] of 8": lambda dev: random_tensor(torch.float64, 8, 23, dev)[1::7],
    "complex conj at stride 3": lambda dev: random_tensor(torch.complex64, 6, 24, dev)[1::3][:1].conj(),
    "neg view at stride 2": lambda dev: random_tensor(torch.complex64, 4, 25, dev).conj()[::2][1:].imag,
    "(1, 1) of a transpose": lambda dev: random_tensor(torch.int16, 12, 26, dev).reshape(3, 4).t()[1:2, 2:3],
    "expanded one element": lambda dev: random_tensor(torch.int32, 4, 27, dev)[::2][1:].expand(1, 1),
}


@pytest.mark.parametrize("name", list(ONE_ELEMENT_VIEWS))
def test_one_element_view_with_any_stride_matches_its_contiguous_copy(name: str) -> None:
    view = ONE_ELEMENT_VIEWS[name]("cpu")
    assert view.numel() == 1 and view.stride() != (1,) * view.dim()
    copy = dense_copy(view)
    assert fingerprint(view) == fingerprint(copy) == fingerprint_bytes(tensor_bytes(copy))
    assert tensor_bytes(view) == tensor_bytes(copy) and certificate(view) == certificate(copy)


def strided_case(rng: random.Random, dtype: torch.dtype) -> tuple[torch.Tensor, bytes]:
    """A random as_strided view (strides 0, 1 or more, any order, overlapping or not) of random bytes,
    and its logical bytes gathered element by element with numpy: an oracle that uses no torch view."""
    ndim = rng.randint(0, 4)
    shape = [rng.choice([0, 1, 1, 2, 3, 5]) for _ in range(ndim)]
    strides = [rng.choice([0, 1, 2, 3, 7, 20]) for _ in range(ndim)]
    offset = rng.randint(0, 5)
    esize = torch.empty(0, dtype=dtype).element_size()
    span = offset + sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if n) + 1
    raw = np.frombuffer(rng.randbytes(span * esize), dtype=np.uint8)
    view = torch.from_numpy(raw.copy()).view(dtype).as_strided(shape, strides, offset)
    index = np.full(shape, offset, dtype=np.int64)
    for axis, (n, s) in enumerate(zip(shape, strides, strict=True)):
        index += (np.arange(n) * s).reshape([n if a == axis else 1 for a in range(ndim)])
    gathered = raw.reshape(-1, esize)[index.reshape(-1)]
    return view, gathered.tobytes()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.uint8, torch.complex64],
                         ids=str)
def test_any_strided_view_hashes_its_logical_bytes(dtype: torch.dtype) -> None:
    rng = random.Random(str(dtype))
    for _ in range(300):
        view, logical = strided_case(rng, dtype)
        case = (tuple(view.shape), view.stride(), view.storage_offset())
        assert tensor_bytes(view) == logical, case
        assert fingerprint(view) == fingerprint_bytes(logical), case


ALL_DTYPES = sorted({d for d in vars(torch).values() if isinstance(d, torch.dtype)}, key=str)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype_torch_has_hashes_its_bytes_as_stored(dtype: torch.dtype) -> None:
    raw = random_tensor(torch.uint8, 96, 40)
    # A uint8 buffer viewed as a quantized dtype has no quantizer (is_quantized is False): plain bytes.
    t = raw.view(dtype)
    esize = t.element_size()
    every_third = b"".join(tensor_bytes(raw)[i * esize : (i + 1) * esize] for i in range(1, t.numel(), 3))
    assert fingerprint(t[1::3]) == fingerprint_bytes(every_third)


def test_neg_view_hashes_the_negated_values() -> None:
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    imag = z.conj().imag  # a lazy negation of z's imaginary parts
    assert imag.is_neg()
    assert fingerprint(imag) == fingerprint(torch.tensor([-2.0, 4.0]))


def two_tensor() -> torch.Tensor:
    from torch.testing._internal.two_tensor import TwoTensor

    return TwoTensor(torch.ones(3), torch.zeros(3))


# Tensors torch.save can hold (and torch.load(weights_only=True) gives back) whose bytes alone are not their
# values, or which have no bytes: refused with a TypeError that says what the tensor is and what to do.
REFUSED: dict[str, tuple[Callable[[], torch.Tensor], str]] = {
    "sparse coo": (lambda: torch.eye(3).to_sparse(), "sparse_coo.*to_dense"),
    "sparse csr": (lambda: torch.eye(3).to_sparse_csr(), "sparse_csr.*to_dense"),
    "sparse bsr": (lambda: torch.eye(4).to_sparse_bsr((2, 2)), "sparse_bsr.*to_dense"),
    "nested": (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), "nested.*unbind"),
    "nested jagged": (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged),
                      "nested.*unbind"),
    "meta": (lambda: torch.empty(3, device="meta"), "meta.*no data"),
    "wrapper subclass": (two_tensor, "TwoTensor.*__torch_dispatch__"),
}


@pytest.mark.filterwarnings("ignore::UserWarning")  # sparse CSR/BSR and nested tensors are beta/prototype
@pytest.mark.parametrize("name", list(REFUSED))
def test_tensor_without_plain_bytes_is_refused_with_what_to_do(name: str) -> None:
    build, message = REFUSED[name]
    for function in (fingerprint, certificate, tensor_bytes):
        with pytest.raises(TypeError, match=message):
            function(build())


def test_quantized_tensors_are_refused_not_a_crash() -> None:
    # Until refused, hashing a quantized tensor's bytes killed the process (SIGSEGV): run it in a child.
    code = (
        "import torch, warnings; warnings.simplefilter('ignore')\n"
        "from detlab.tensors.fingerprint import fingerprint, certificate\n"
        "qs = [torch.quantize_per_tensor(torch.randn(5), 0.1, 3, torch.quint8),\n"
        "      torch.quantize_per_channel(torch.randn(2, 3), torch.tensor([0.1, 0.2]), torch.tensor([0, 1]), 0,\n"
        "                                 torch.qint8)]\n"
        "for q in qs:\n"
        "    for f in (fingerprint, certificate):\n"
        "        try:\n"
        "            f(q)\n"
        "        except TypeError as exc:\n"
        "            print(exc)\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    refusals = done.stdout.splitlines()
    assert len(refusals) == 4 and all("quantized" in r and "int_repr" in r for r in refusals), refusals


# --- digest format and packing -------------------------------------------------------------------------


def test_digest_format() -> None:
    assert re.fullmatch(r"fp2:[0-9a-f]{32}", fingerprint(torch.ones(3)))
    assert re.fullmatch(r"fp1:[0-9a-f]{32}", fingerprint(torch.ones(3), key=FP1_KEY))
    assert FP_VERSION == "fp2"


def test_packing_roundtrip() -> None:
    digest = fingerprint(torch.ones(3))
    packed = digest_to_bytes(digest)
    assert len(packed) == 16
    assert bytes_to_digest(packed) == digest
    old = fingerprint(torch.ones(3), key=FP1_KEY)
    assert bytes_to_digest(digest_to_bytes(old), "fp1") == old


MALFORMED = ["fp3:" + "0" * 32, "fp2:" + "0" * 31, "fp1:" + "A" * 32, "0" * 36, "fp2-keyed:" + "0" * 32,
             "fp2:" + "0" * 32 + "\n"]


@pytest.mark.parametrize("bad", MALFORMED)
def test_digest_to_bytes_rejects_malformed_digests(bad: str) -> None:
    with pytest.raises(ValueError, match="fp1, fp2"):
        digest_to_bytes(bad)


def test_a_list_of_digests_packs_as_each_one_does() -> None:
    digests = [fingerprint(torch.arange(n, dtype=torch.float32), key=key) for n in range(5) for key in (FP1_KEY,
                                                                                                         FP2_KEY)]
    assert digests_to_bytes(digests) == b"".join(map(digest_to_bytes, digests))
    assert digests_to_bytes([]) == b""


@pytest.mark.parametrize("bad", [*MALFORMED, "", "fp2:" + "0" * 32 + "fp2:" + "0" * 32])
def test_a_list_with_one_malformed_digest_is_refused_naming_it(bad: str) -> None:
    good = fingerprint(torch.ones(3))
    with pytest.raises(ValueError, match=f"not a fingerprint digest: {re.escape(repr(bad))}"):
        digests_to_bytes([good, bad, good])


def test_bytes_to_digest_rejects_wrong_length() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        bytes_to_digest(b"\x00" * 15)


def test_certificate_is_sha256_of_the_logical_bytes() -> None:
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    assert certificate(t) == hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()


def test_reference_works_without_importing_torch() -> None:
    code = (
        "import sys; from detlab.tensors.fingerprint import fingerprint_bytes, digest_to_bytes; "
        "digest_to_bytes(fingerprint_bytes(b'abc')); assert 'torch' not in sys.modules, 'torch imported'"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# --- GPU (run on the device machine) --------------------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_cuda_matches_reference(dtype: torch.dtype) -> None:
    for seed, numel in enumerate(SIZES):
        t = random_tensor(dtype, numel, seed, device="cuda")
        assert fingerprint_torch(t) == fingerprint_bytes(tensor_bytes(t)), (dtype, numel)


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_triton_matches_torch_cuda_and_reference(dtype: torch.dtype) -> None:
    from detlab.tensors.fingerprint.triton_impl import fingerprint_many_triton

    tensors = [random_tensor(dtype, n, seed, device="cuda") for seed, n in enumerate(SIZES + [100_003])]
    expected = [fingerprint_bytes(tensor_bytes(t)) for t in tensors]
    assert fingerprint_many_triton(tensors) == expected
    assert [fingerprint_torch(t) for t in tensors] == expected


@needs_cuda
def test_triton_multi_tensor_list_matches_per_tensor_digests() -> None:
    from detlab.tensors.fingerprint.triton_impl import fingerprint_many_triton

    tensors = [random_tensor(d, 1000 * i + 3, i, device="cuda") for i, d in enumerate(DTYPES)]
    tensors += [tensors[0].reshape(-1)[1:], tensors[3][::2], torch.empty(0, device="cuda")]
    assert fingerprint_many_triton(tensors) == [fingerprint_bytes(tensor_bytes(t)) for t in tensors]


@needs_cuda
def test_cuda_uses_triton_when_available() -> None:
    pytest.importorskip("triton")
    assert implementation_name("cuda") == "triton"


@needs_cuda
def test_triton_kept_plan_sees_in_place_changes() -> None:
    from detlab.tensors.fingerprint.triton_impl import fingerprint_many_triton

    x = random_tensor(torch.float32, 100_003, 1, device="cuda")
    seen = fingerprint_many_triton([x])
    # Same storage, shape, strides: the launch table is kept (first reuse: captured as a CUDA graph; then
    # replayed), and every run reads the bytes again.
    for i in range(3):
        x.view(torch.int32)[77 + i] ^= 1
        now = fingerprint_many_triton([x])
        assert now == [fingerprint_bytes(tensor_bytes(x))] != seen
        seen = now


@needs_cuda
def test_triton_kept_plan_tells_views_of_one_storage_apart() -> None:
    from detlab.tensors.fingerprint.triton_impl import fingerprint_many_triton

    c = random_tensor(torch.complex64, 64, 2, device="cuda").reshape(8, 8)
    views = [c, c.conj(), c.t(), c[:4], c.view(torch.float32), c.reshape(-1)[:3]]
    for _ in range(2):
        assert [fingerprint_many_triton([v])[0] for v in views] == [fingerprint_bytes(tensor_bytes(v)) for v in views]


@needs_cuda
@pytest.mark.parametrize("extra_bytes", [-9, -8, -1, 0, 1, 7, 8, 9])
def test_triton_partial_last_word_next_to_a_tile_boundary(extra_bytes: int) -> None:
    from detlab.tensors.fingerprint.triton_impl import CONFIG, fingerprint_many_triton

    t = random_tensor(torch.uint8, 2 * CONFIG.tile * 8 + extra_bytes, 3, device="cuda")
    pair = [t, t[:5]]
    assert fingerprint_many_triton(pair) == [fingerprint_bytes(tensor_bytes(v)) for v in pair]


@needs_cuda
def test_triton_plan_cache_is_bounded_and_keeps_no_tensor_alive() -> None:
    import gc
    import weakref

    from detlab.tensors.fingerprint import triton_impl

    tensors = [torch.full((16,), i, device="cuda") for i in range(triton_impl.CACHE_SIZE + 5)]
    refs = [weakref.ref(t) for t in tensors]
    for t in tensors:
        triton_impl.fingerprint_many_triton([t])
    assert len(triton_impl._plans) <= triton_impl.CACHE_SIZE
    del t, tensors
    gc.collect()
    assert all(r() is None for r in refs)


@needs_cuda
def test_triton_kept_graph_is_not_reused_for_another_view_at_the_same_address() -> None:
    from detlab.tensors.fingerprint.triton_impl import fingerprint_many_triton

    x = random_tensor(torch.float32, 64 * 33, 4, device="cuda").reshape(64, 33)
    for _ in range(3):  # kept, captured, replayed
        assert fingerprint_many_triton([x]) == [fingerprint_bytes(tensor_bytes(x))]
    for view in [x.t(), x[:5], x.view(torch.int32), x]:
        assert fingerprint_many_triton([view]) == [fingerprint_bytes(tensor_bytes(view))]


@needs_triton
def test_the_triton_kernel_under_the_interpreter_equals_the_reference() -> None:
    """The kernel's logic on the CPU, for every CI run: the GPU tests below run on a GPU machine only."""
    interpreted("fingerprint")


def test_the_digest_queue_keeps_at_most_slots_launches_of_a_list_however_far_its_reader_falls_behind() -> None:
    """detlab.tensors.digests.Digester kept every slot it made for a list: each launch's buffers (device and pinned)
    and graph stay reserved until its result is read, so a reader that fell behind, or never read, grew what the
    queue kept at every step. Driven as its CUDA launch drives it (no kept slot free: a new one, offered to keep)."""
    from detlab.tensors.digests import SLOTS, Digester, _Slot
    from detlab.tensors.named import ListKey

    tensors = [torch.randn(10), torch.randn(3)]
    queue, key = Digester(), ListKey(tensors)
    for _ in range(SLOTS + 5):  # none is read
        assert queue._slot(key) is None
        queue._keep(key, _Slot(plan=None))
    assert len(queue._plans[key]) == SLOTS
    (first, *_) = queue._plans[key]
    queue._release(first)
    assert queue._slot(key) is first  # a kept slot, once read, is the next launch's


@needs_cuda
def test_the_recorders_digest_queue_replays_a_cuda_graph_from_a_lists_second_step() -> None:
    """detlab.tensors.digests (Recorder(drift=False)) launched the kernels from Python at every step: its kept
    plans were never captured, so a step cost the host tens of microseconds a launch instead of one replay."""
    from detlab.tensors.digests import Digester

    params = [random_tensor(torch.float32, n, n, device="cuda") for n in (3, 1000, 70_000)]
    queue = Digester()
    for step in range(4):
        params[1].add_(1.0)  # changed in place, as an optimizer does: the replay reads the new values
        want = digests_to_bytes([fingerprint_bytes(tensor_bytes(p)) for p in params])
        assert queue.submit(params).packed() == want, step
    (slots,) = queue._plans.values()
    assert [s.plan.graph is not None for s in slots] == [True] * len(slots)


@needs_cuda
def test_a_thread_waiting_for_queued_digests_sleeps_instead_of_spinning() -> None:
    """A plain CUDA event's synchronize() busy-waits: the recorder's writer, which waits for each step's
    digests from the moment they are queued, kept a CPU core spinning for most of every step."""
    import threading
    import time

    from detlab.tensors.digests import Digester

    x = torch.randn(1000, device="cuda")
    queue = Digester()
    queue.submit([x]).packed()  # planned and compiled before the timed wait
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU time ahead of the digests
    pending = queue.submit([x])
    spent: dict[str, float] = {}

    def wait() -> None:
        cpu, wall = time.thread_time(), time.perf_counter()
        pending.packed()
        spent["cpu"], spent["wall"] = time.thread_time() - cpu, time.perf_counter() - wall

    reader = threading.Thread(target=wait)
    reader.start()
    reader.join()
    assert spent["wall"] > 0.2 and spent["cpu"] < 0.1 * spent["wall"], spent


@needs_cuda
def test_triton_plan_cache_drops_the_least_recently_used_plan() -> None:
    from detlab.tensors.fingerprint import triton_impl

    triton_impl.clear_plan_cache()
    tensors = [torch.full((16,), i, device="cuda") for i in range(triton_impl.CACHE_SIZE + 1)]
    for t in tensors[:-1]:
        triton_impl.fingerprint_many_triton([t])
    triton_impl.fingerprint_many_triton([tensors[0]])  # the oldest plan, used again
    triton_impl.fingerprint_many_triton([tensors[-1]])  # one plan too many: the second is dropped
    kept = {key[-1] for key in triton_impl._plans}  # (device, config, digest key, data pointers)
    assert (tensors[0].data_ptr(),) in kept and (tensors[1].data_ptr(),) not in kept


@needs_cuda
def test_a_models_parameters_each_step_as_a_training_loop_passes_them() -> None:
    model = torch.nn.Linear(33, 17).cuda()
    params = list(model.parameters())  # require grad; the same list every step, as detlab.worker.ranks.train passes it
    seen = set()
    for _ in range(3):
        digests = fingerprint_many(params)
        assert digests == [fingerprint_bytes(tensor_bytes(p)) for p in params]
        seen.add(tuple(digests))
        with torch.no_grad():
            model.weight.add_(1.0)
    assert len(seen) == 3


@needs_cuda
@pytest.mark.parametrize("name", list(ONE_ELEMENT_VIEWS))
def test_one_element_views_on_cuda_match_the_reference(name: str) -> None:
    from detlab.tensors.fingerprint.triton_impl import fingerprint_many_triton

    view = ONE_ELEMENT_VIEWS[name]("cuda")
    want = fingerprint_bytes(tensor_bytes(dense_copy(view.cpu())))
    assert fingerprint_torch(view) == want
    for _ in range(3):  # planned, kept and captured, replayed
        assert fingerprint_many_triton([view]) == [want]


@needs_cuda
def test_keyed_digests_on_cuda_match_the_keyed_reference() -> None:
    tensors = [random_tensor(d, 1003, i, device="cuda") for i, d in enumerate(DTYPES)]
    tensors.append(tensors[0][1::3])
    assert fingerprint_many(tensors, key=KEY) == [fingerprint_bytes(tensor_bytes(t), key=KEY) for t in tensors]


@needs_cuda
def test_quantized_cuda_tensor_is_refused_by_triton_and_torch_paths() -> None:
    from detlab.tensors.fingerprint.triton_impl import fingerprint_many_triton

    q = torch.quantize_per_tensor(torch.randn(64, device="cuda"), 0.1, 3, torch.quint8)
    for run in (fingerprint, fingerprint_torch, lambda t: fingerprint_many_triton([t])):
        with pytest.raises(TypeError, match="quantized"):
            run(q)


@needs_cuda
def test_fp1_on_request_runs_the_triton_kernel_and_matches_the_reference() -> None:
    from detlab.tensors.fingerprint import _triton_ready
    from detlab.tensors.fingerprint.triton_impl import fingerprint_many_triton

    tensors = [random_tensor(d, 1003, i, device="cuda") for i, d in enumerate(DTYPES)]
    want = [fingerprint_bytes(tensor_bytes(t), key=FP1_KEY) for t in tensors]
    assert _triton_ready(torch.device("cuda"), FP1_KEY)
    for _ in range(3):  # planned, kept and captured, replayed: under their own key, apart from fp2's plans
        assert fingerprint_many(tensors, key=FP1_KEY) == want
        assert fingerprint_many(tensors) == [fingerprint_bytes(tensor_bytes(t)) for t in tensors]
    assert fingerprint_many_triton(tensors, key=FP1_KEY) == want


def test_a_pending_list_puts_each_parts_packed_digests_at_their_indices() -> None:
    """A list on several devices is read in parts (one per device); the packed result is in the list's order."""
    from detlab.tensors.digests import Pending
    from detlab.tensors.fingerprint import split_packed

    pending = Pending(3)
    pending.add([2, 0], lambda: b"c" * 16 + b"a" * 16)
    pending.add([1], lambda: b"b" * 16)
    assert pending.packed() == b"a" * 16 + b"b" * 16 + b"c" * 16
    with pytest.raises(ValueError, match="a multiple of 16 bytes, got 17"):
        split_packed(bytes(17))
