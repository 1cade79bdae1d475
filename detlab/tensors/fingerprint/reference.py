"""The fingerprint reference: the algorithm written once in numpy, for every version, plus the digest format.

Everything else (the torch path, the Triton kernel) must agree with this module bit for bit. It imports
only numpy, so backend code that never loads torch can fingerprint bytes it received. The algorithm is
specified in docs/fingerprint.md; the constants below are the normative ones. Versions differ only in their
two lane mixers: `fp2` (the default) uses mixers whose outer xorshifts are by 32 bits, which a GPU does on
32-bit halves for free; `fp1` is frozen and still computed on request (`FP1_KEY`). A `DigestKey` holds a
version's public position and length constants, or secret random ones: the keyed digests of `detlab diff`.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

# The version new digests are made with.
FP_VERSION = "fp2"
DIGEST_BYTES = 16
MASK64 = (1 << 64) - 1

# A lane mixer (s1, m1, s2, m2, s3): z ^= z >> s1; z *= m1; z ^= z >> s2; z *= m2; z ^= z >> s3. Odd
# multipliers and non-zero shifts make each a bijection of the 64-bit words.
Mixer = tuple[int, int, int, int, int]
# fp1: lane 0 the splitmix64 finalizer (Stafford "Mix13"), lane 1 MurmurHash3 fmix64.
MIX0_FP1 = (30, 0xBF58476D1CE4E5B9, 27, 0x94D049BB133111EB, 31)
MIX1_FP1 = (33, 0xFF51AFD7ED558CCD, 33, 0xC4CEB9FE1A85EC53, 33)
# fp2: lane 0 Stafford's "Mix09" (shifts 32, 29, 32), lane 1 the same shifts with fmix64's multipliers.
MIX0_FP2 = (32, 0x4CD6944C5CC20B6D, 29, 0xFC12C5B19D3259E9, 32)
MIX1_FP2 = (32, 0xFF51AFD7ED558CCD, 29, 0xC4CEB9FE1A85EC53, 32)
MIXERS: dict[str, tuple[Mixer, Mixer]] = {"fp1": (MIX0_FP1, MIX1_FP1), "fp2": (MIX0_FP2, MIX1_FP2)}
# Odd position multipliers (golden ratio, R2 sequence): j -> j * G is a bijection mod 2^64, so every word
# index gets its own key offset, with no size limit short of 2^64 words. The same in every version.
POS_MUL = (0x9E3779B97F4A7C15, 0xD1B54A32D192ED03)
# Length keys (SHA-512 initial hash values: nothing up the sleeve).
LEN_KEY = (0x6A09E667F3BCC908, 0xBB67AE8584CAA73B)

WORD_BYTES = 8
# Words per numpy chunk: bounds the reference's temporary memory to a few tens of MiB.
CHUNK_WORDS = 1 << 20

_DIGEST_RE = re.compile(r"(fp[0-9]+):[0-9a-f]{32}")


@dataclass(frozen=True)
class DigestKey:
    """A version's constants for its two lanes: word j enters lane k as M_k(u_j XOR (j * pos_mul[k] +
    pos_add[k])), the byte length as M_k(L XOR len_key[k]), with the version's mixers M_k.

    `FP2_KEY` and `FP1_KEY` hold the public values (`public`: digests say "fp2:"); `DigestKey.random()` draws
    secret ones ("fp2-keyed:"), so that a collision built from the public constants (or searched for with
    them) does not carry over. Multipliers must be odd, so distinct positions keep distinct offsets. Values
    stay out of repr: a key in a log is a spent key.
    """

    pos_mul: tuple[int, int] = field(repr=False)
    pos_add: tuple[int, int] = field(repr=False)
    len_key: tuple[int, int] = field(repr=False)
    version: str = FP_VERSION
    public: bool = False

    def __post_init__(self) -> None:
        values = (*self.pos_mul, *self.pos_add, *self.len_key)
        if len(values) != 6 or not all(0 <= v <= MASK64 for v in values):
            raise ValueError("a digest key holds two 64-bit unsigned values per field")
        if not all(m & 1 for m in self.pos_mul):
            raise ValueError("position multipliers must be odd (j * m must be injective mod 2^64)")
        if self.version not in MIXERS:
            raise ValueError(f"unknown fingerprint version {self.version!r}; known: {', '.join(MIXERS)}")

    @property
    def mixers(self) -> tuple[Mixer, Mixer]:
        return MIXERS[self.version]

    @property
    def prefix(self) -> str:
        """What a digest under this key starts with: the version, and "-keyed" for a secret key."""
        return self.version if self.public else f"{self.version}-keyed"

    @classmethod
    def random(cls, version: str = FP_VERSION) -> DigestKey:
        """A fresh key from the OS's CSPRNG (`secrets`): 2 x 63 + 2 x 64 + 2 x 64 secret bits."""
        r = [secrets.randbits(64) for _ in range(6)]
        return cls(pos_mul=(r[0] | 1, r[1] | 1), pos_add=(r[2], r[3]), len_key=(r[4], r[5]), version=version)


# The public keys: position offsets j * G_k with nothing added. Only the mixers differ between versions.
FP1_KEY = DigestKey(pos_mul=POS_MUL, pos_add=(0, 0), len_key=LEN_KEY, version="fp1", public=True)
FP2_KEY = DigestKey(pos_mul=POS_MUL, pos_add=(0, 0), len_key=LEN_KEY, version="fp2", public=True)
PUBLIC_KEYS = {"fp1": FP1_KEY, "fp2": FP2_KEY}
DEFAULT_KEY = PUBLIC_KEYS[FP_VERSION]


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


def lane_sums_np(words: np.ndarray, first_pos: int, key: DigestKey = DEFAULT_KEY) -> tuple[int, int]:
    """Lane sums mod 2^64 of the terms of `words` (uint64), the first of which sits at word `first_pos`."""
    pos = np.arange(len(words), dtype=np.uint64) + np.uint64(first_pos & MASK64)
    sums = []
    for lane, params in enumerate(key.mixers):
        offset = pos * np.uint64(key.pos_mul[lane])
        if key.pos_add[lane]:
            offset += np.uint64(key.pos_add[lane])
        offset ^= words
        sums.append(int(_mix_np(offset, params).sum(dtype=np.uint64)))
    return sums[0], sums[1]


def finalize(s0: int, s1: int, nbytes: int, key: DigestKey = DEFAULT_KEY) -> str:
    """Turn the two lane sums and the byte length into the digest string."""
    m0, m1 = key.mixers
    h0 = mix_int(s0 ^ mix_int(nbytes ^ key.len_key[0], m0), m0)
    h1 = mix_int(s1 ^ mix_int(nbytes ^ key.len_key[1], m1), m1)
    return f"{key.prefix}:{h0:016x}{h1:016x}"


def fingerprint_bytes(
    data: bytes | bytearray | memoryview, chunk_words: int = CHUNK_WORDS, *, key: DigestKey = DEFAULT_KEY
) -> str:
    """Digest of a byte string under `key` (fp2 by default): the numpy reference every implementation matches."""
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
    """Pack a digest string of any public version into its 16 raw bytes (the version is not kept: store it)."""
    if not _DIGEST_RE.fullmatch(digest) or digest.split(":")[0] not in PUBLIC_KEYS:
        raise ValueError(
            f"not a fingerprint digest: {digest!r}; expected a version ({', '.join(PUBLIC_KEYS)}), ':' and 32 "
            "lowercase hex digits"
        )
    return bytes.fromhex(digest.split(":")[1])


# A list of digests joined by newlines: one digest per line, so no item can hold two or none.
_DIGEST_LINES_RE = re.compile(f"(?:(?:{'|'.join(PUBLIC_KEYS)}):[0-9a-f]{{32}}\n)*")
_VERSION_RE = re.compile("fp[0-9]+:")


def digests_to_bytes(digests: Sequence[str]) -> bytes:
    """digest_to_bytes of each digest, joined (a step's list: one check and one decode for all)."""
    if not _DIGEST_LINES_RE.fullmatch(lines := "".join(d + "\n" for d in digests)):
        return b"".join(map(digest_to_bytes, digests))  # raises, naming the first bad digest
    return bytes.fromhex(_VERSION_RE.sub("", lines))  # fromhex skips the newlines


def split_packed(packed: bytes) -> list[bytes]:
    """Packed digests (digests_to_bytes) back into one DIGEST_BYTES piece per digest."""
    if len(packed) % DIGEST_BYTES:
        raise ValueError(f"packed digests are a multiple of {DIGEST_BYTES} bytes, got {len(packed)}")
    return [packed[i : i + DIGEST_BYTES] for i in range(0, len(packed), DIGEST_BYTES)]


def bytes_to_digest(packed: bytes, version: str = FP_VERSION) -> str:
    """Unpack 16 raw bytes (from digest_to_bytes) into the digest string of `version`."""
    if len(packed) != DIGEST_BYTES:
        raise ValueError(f"a packed digest is {DIGEST_BYTES} bytes, got {len(packed)}")
    if version not in PUBLIC_KEYS:
        raise ValueError(f"unknown fingerprint version {version!r}; known: {', '.join(PUBLIC_KEYS)}")
    return f"{version}:{bytes(packed).hex()}"
