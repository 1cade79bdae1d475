"""Algorithm and protocol names as NCCL spells them, and reading NCCL_ALGO/NCCL_PROTO values."""

from __future__ import annotations

import re

# Canonical names are ncclAlgoToString()/ncclProtoToString() (src/collectives.cc), which the
# >= 2.24 "AllReduce: N Bytes -> Algo RING proto SIMPLE" lines print.
ALGOS = ["TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"]
PROTOS = ["LL", "LL128", "SIMPLE"]

_ALGO_ALIASES = {
    "TREE": "TREE", "RING": "RING", "COLLNET": "COLLNET", "COLLNETDIRECT": "COLLNET_DIRECT",
    "COLLNETCHAIN": "COLLNET_CHAIN", "NVLS": "NVLS", "NVLSTREE": "NVLS_TREE", "PAT": "PAT",
}
_PROTO_ALIASES = {"LL": "LL", "LL128": "LL128", "SIMPLE": "SIMPLE"}
KIND_NAMES = {"algo": ALGOS, "proto": PROTOS}


def algo_name(value: str | int, version: tuple[int, ...] | None = None) -> str:
    """Canonical algorithm name for a printed name or number (NCCL_ALGO_* in nccl_common.h)."""
    if isinstance(value, int) or str(value).isdigit():
        n = int(value)
        # Before 2.12 there was a single CollNet algorithm at index 2 and nothing after it.
        if n == 2 and version is not None and version < (2, 12):
            return "COLLNET"
        return ALGOS[n] if 0 <= n < len(ALGOS) else f"ALGO{n}"
    key = re.sub(r"[^A-Z0-9]", "", str(value).upper())
    return _ALGO_ALIASES.get(key, str(value).upper())


def proto_name(value: str | int) -> str:
    """Canonical protocol name for a printed name or number (NCCL_PROTO_*: 0 LL, 1 LL128, 2 Simple)."""
    if isinstance(value, int) or str(value).isdigit():
        n = int(value)
        return PROTOS[n] if 0 <= n < len(PROTOS) else f"PROTO{n}"
    key = re.sub(r"[^A-Z0-9]", "", str(value).upper())
    return _PROTO_ALIASES.get(key, str(value).upper())


def _names(kind: str, tokens: list[str]) -> set[str]:
    canon = algo_name if kind == "algo" else proto_name
    out: set[str] = set()
    for token in tokens:
        name = canon(token) if token else ""
        if name == "COLLNET":  # the user's "CollNet" covers both variants
            out |= {"COLLNET", "COLLNET_DIRECT", "COLLNET_CHAIN"}
        elif name:
            out.add(name)
    return out


def allowed(kind: str, value: str, op: str | None = None) -> set[str] | None:
    """Names that an NCCL_ALGO ("algo") or NCCL_PROTO ("proto") value allows for a collective.

    Understands "Tree,Ring", exclusion lists "^NVLS,CollNet", and the per-collective form of
    2.24+ ("allreduce:tree,ring;allgather:^pat"). None means the value places no limit on `op`.
    """
    universe = set(KIND_NAMES[kind]) | ({"COLLNET"} if kind == "algo" else set())
    spec = value.strip()
    if ":" in spec:
        chosen = None
        for part in spec.split(";"):
            func, _, rest = part.partition(":")
            if op is not None and func.strip().lower() == op.lower():
                chosen = rest
        if chosen is None:
            return None
        spec = chosen.strip()
    exclude = spec.startswith("^")
    names = _names(kind, [t.strip() for t in spec.lstrip("^").split(",")])
    return universe - names if exclude else names
