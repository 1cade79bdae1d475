"""fp1 reference: the algorithm written once in numpy, plus the digest format.

Everything else (the torch path, the Triton kernel) must agree with this module bit for bit. It imports
only numpy, so backend code that never loads torch can fingerprint bytes it received. The algorithm is
specified in docs/fingerprint.md; the constants below are the normative ones. A `DigestKey` replaces fp1's
public position and length constants by secret random ones: the keyed digests of `detlab diff`.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field

import numpy as np

FP_VERSION = "fp1"
DIGEST_BYTES = 16
MASK64 = (1 << 64) - 1

# Lane 0 mixer: the splitmix64 finalizer (Stafford "Mix13"). Lane 1 mixer: MurmurHash3 fmix64. Both are
# xorshift-multiply chains with odd multipliers, hence bijections of the 64-bit words.
MIX0 = (30, 0xBF58476D1CE4E5B9, 27, 0x94D049BB133111EB, 31)
MIX1 = (33, 0xFF51AFD7ED558CCD, 33, 0xC4CEB9FE1A85EC53, 33)
# Odd position multipliers (golden ratio, R2 sequence): j -> j * G is a bijection mod 2^64, so every word
# index gets its own key offset, with no size limit short of 2^64 words.
POS_MUL = (0x9E3779B97F4A7C15, 0xD1B54A32D192ED03)
# Length keys (SHA-512 initial hash values: nothing up the sleeve).
LEN_KEY = (0x6A09E667F3BCC908, 0xBB67AE8584CAA73B)

WORD_BYTES = 8
# Words per numpy chunk: bounds the reference's temporary memory to a few tens of MiB.
CHUNK_WORDS = 1 << 20

_DIGEST_RE = re.compile(r"^fp1:[0-9a-f]{32}$")
# Keyed digests carry this prefix: they compare only with digests made under the same key, never stored.
KEYED_PREFIX = "fp1-keyed"


@dataclass(frozen=True)
class DigestKey:
    """The constants of fp1's two lanes: word j enters lane k as M_k(u_j XOR (j * pos_mul[k] + pos_add[k])),
    the byte length as M_k(L XOR len_key[k]).

    `FP1_KEY` holds fp1's public values; `DigestKey.random()` draws secret ones, so that a collision built
    from the public constants (or searched for with them) does not carry over. Multipliers must be odd, so
    distinct positions keep distinct offsets. Values stay out of repr: a key in a log is a spent key.
    """

    pos_mul: tuple[int, int] = field(repr=False)
    pos_add: tuple[int, int] = field(repr=False)
    len_key: tuple[int, int] = field(repr=False)
    prefix: str = KEYED_PREFIX

    def __post_init__(self) -> None:
        values = (*self.pos_mul, *self.pos_add, *self.len_key)
        if len(values) != 6 or not all(0 <= v <= MASK64 for v in values):
            raise ValueError("a digest key holds two 64-bit unsigned values per field")
        if not all(m & 1 for m in self.pos_mul):
            raise ValueError("position multipliers must be odd (j * m must be injective mod 2^64)")

    @classmethod
    def random(cls) -> DigestKey:
        """A fresh key from the OS's CSPRNG (`secrets`): 2 x 63 + 2 x 64 + 2 x 64 secret bits."""
        r = [secrets.randbits(64) for _ in range(6)]
        return cls(pos_mul=(r[0] | 1, r[1] | 1), pos_add=(r[2], r[3]), len_key=(r[4], r[5]))


# fp1 itself: public constants, position offsets j * G_k with nothing added.
FP1_KEY = DigestKey(pos_mul=POS_MUL, pos_add=(0, 0), len_key=LEN_KEY, prefix=FP_VERSION)


def mix_int(z: int, params: tuple[int, int, int, int, int]) -> int:
    """Apply a lane mixer to one Python int (mod 2^64)."""
    s1, m1, s2, m2, s3 = params
    z &= MASK64
    z = ((z ^ (z >> s1)) * m1) & MASK64
    z = ((z ^ (z >> s2)) * m2) & MASK64
    return z ^ (z >> s3)


def _mix_np(z: np.ndarray, params: tuple[int, int, int, int, int]) -> np.ndarray:
    """Apply a lane mixer in place to a uint64 array (numpy array arithmetic wraps mod 2^64)."""
    s1, m1, s2, m2, s3 = params
    z ^= z >> np.uint64(s1)
    z *= np.uint64(m1)
    z ^= z >> np.uint64(s2)
    z *= np.uint64(m2)
    z ^= z >> np.uint64(s3)
    return z


def lane_sums_np(words: np.ndarray, first_pos: int, key: DigestKey = FP1_KEY) -> tuple[int, int]:
    """Lane sums mod 2^64 of the terms of `words` (uint64), the first of which sits at word `first_pos`."""
    pos = np.arange(len(words), dtype=np.uint64) + np.uint64(first_pos & MASK64)
    sums = []
    for lane, params in enumerate((MIX0, MIX1)):
        offset = pos * np.uint64(key.pos_mul[lane])
        if key.pos_add[lane]:
            offset += np.uint64(key.pos_add[lane])
        offset ^= words
        sums.append(int(_mix_np(offset, params).sum(dtype=np.uint64)))
    return sums[0], sums[1]


def finalize(s0: int, s1: int, nbytes: int, key: DigestKey = FP1_KEY) -> str:
    """Turn the two lane sums and the byte length into the digest string."""
    h0 = mix_int(s0 ^ mix_int(nbytes ^ key.len_key[0], MIX0), MIX0)
    h1 = mix_int(s1 ^ mix_int(nbytes ^ key.len_key[1], MIX1), MIX1)
    return f"{key.prefix}:{h0:016x}{h1:016x}"


def finalize_many(s0: np.ndarray, s1: np.ndarray, nbytes: np.ndarray) -> list[str]:
    """`finalize` (fp1's public key) for arrays of lane sums (uint64) and byte lengths: one numpy pass."""
    n = np.asarray(nbytes, dtype=np.uint64)
    h0 = _mix_np(np.asarray(s0, dtype=np.uint64) ^ _mix_np(n ^ np.uint64(LEN_KEY[0]), MIX0), MIX0)
    h1 = _mix_np(np.asarray(s1, dtype=np.uint64) ^ _mix_np(n ^ np.uint64(LEN_KEY[1]), MIX1), MIX1)
    # One big-endian hex dump then slicing: formatting ints one by one dominated for ~150 tensors.
    hexed = np.stack([h0, h1], axis=1).astype(">u8").tobytes().hex()
    return [f"{FP_VERSION}:{hexed[i : i + 32]}" for i in range(0, len(hexed), 32)]


def fingerprint_bytes(
    data: bytes | bytearray | memoryview, chunk_words: int = CHUNK_WORDS, *, key: DigestKey = FP1_KEY
) -> str:
    """fp1 digest of a byte string (keyed, under `key`): the numpy reference every implementation matches."""
    view = memoryview(data).cast("B")
    nbytes = view.nbytes
    nfull = nbytes // WORD_BYTES
    s0 = s1 = 0
    for start in range(0, nfull, chunk_words):
        count = min(chunk_words, nfull - start)
        words = np.frombuffer(view, dtype="<u8", count=count, offset=start * WORD_BYTES)
        a, b = lane_sums_np(words, start, key)
        s0, s1 = (s0 + a) & MASK64, (s1 + b) & MASK64
    rest = nbytes - nfull * WORD_BYTES
    if rest:
        tail = bytes(view[nfull * WORD_BYTES :]) + bytes(WORD_BYTES - rest)
        a, b = lane_sums_np(np.frombuffer(tail, dtype="<u8"), nfull, key)
        s0, s1 = (s0 + a) & MASK64, (s1 + b) & MASK64
    return finalize(s0, s1, nbytes, key)


def digest_to_bytes(digest: str) -> bytes:
    """Pack an fp1 digest string into its 16 raw bytes (for compact storage)."""
    if not _DIGEST_RE.match(digest):
        raise ValueError(
            f"not an {FP_VERSION} digest: {digest!r}; expected '{FP_VERSION}:' followed by 32 lowercase hex "
            "digits (digests of another version must be unpacked by that version's code)"
        )
    return bytes.fromhex(digest[len(FP_VERSION) + 1 :])


def bytes_to_digest(packed: bytes) -> str:
    """Unpack 16 raw bytes (from digest_to_bytes) into the fp1 digest string."""
    if len(packed) != DIGEST_BYTES:
        raise ValueError(f"a packed {FP_VERSION} digest is {DIGEST_BYTES} bytes, got {len(packed)}")
    return f"{FP_VERSION}:{bytes(packed).hex()}"
