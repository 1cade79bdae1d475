"""The line formats of NCCL/RCCL debug output, 2.3 to 2.29, and small readers for them."""

from __future__ import annotations

import re
from typing import Any

_VERSION = re.compile(r"\b(NCCL|RCCL) version\s*:?\s*(\d+\.\d+\.\d+)(?=[+\-\s]|$)")
_ROCM_BANNER = re.compile(r"^(HIP|ROCm) version\s*:\s*(\S+)")
_ENV_SET = re.compile(r"^((?:NCCL|RCCL|MSCCL)\w*) set by environment to (.*)$")
_ENV_SET_SHORT = re.compile(r"^((?:NCCL|RCCL)_\w+) set to (.*)$")
_INVALID_VALUE = re.compile(r"Invalid value (.*?) for ((?:NCCL|RCCL|MSCCL)\w*)")
_INVALID_WORDS = re.compile(r"\b(?:invalid|ignor\w*|unknown|unsupported|not supported)\b", re.I)
_VAR = re.compile(r"\b((?:NCCL|RCCL|MSCCL)_[A-Z0-9_]+)\b")
_COMM = re.compile(
    r"\bcomm 0x[0-9a-fA-F]+ rank (\d+) n[Rr]anks (\d+) cudaDev (\d+)(?: nvmlDev \d+)?(?: busId ([0-9a-fA-F]+))?"
)
# 2.19+: "comm 0x.. rank 1 nRanks 8 nNodes 1 localRanks 8 localRank 1 MNNVL 0" (no cudaDev: the header's [dev] is it)
_COMM_TOPO = re.compile(r"^comm 0x[0-9a-fA-F]+ rank (\d+) nRanks \d+ nNodes \d+")
_NRANKS = re.compile(r"\bn[Rr]anks[ =](\d+)")
_NNODES = re.compile(r"\bnNodes (\d+)")
_TESTS_RANK = re.compile(
    r"#\s+Rank\s+(\d+)(?:\s+Group\s+\d+)?\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+"
    r"\[(0x[0-9a-fA-F]+|[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})\]"  # nccl-tests: [0x18] or [0000:18:00]
)
_RING_ORDER = re.compile(r"^(?:Channel|Ring) (\d+)(?:/(\d+))? :((?:\s+\d+)+)\s*$")
_COLL_CHANNELS = re.compile(r"^(\d+) coll channels(?:, \d+ collnet channels)?(?:, (\d+) nvls channels)?")
# RCCL ends layout lines with the communicator: "Channel 00/32 :    0   1 comm 0x3e8a2c0 nRanks 08 busId c1000"
_RCCL_COMM_SUFFIX = re.compile(r"\s+comm 0x[0-9a-fA-F]+ nRanks \d+(?: busId [0-9a-fA-F]+)?\s*$")
# Up to 2.5, ring connections print as "Ring 03 : 5[1] -> 6[2] via P2P/IPC" on every rank.
_RING_CONN = re.compile(r"^Ring (\d+) : \d+(?:\[[0-9a-fA-F]+\])? -> \d+")
_INTERNAL_NET = re.compile(r"^Using internal [Nn]etwork (\S+)")  # 2.3
_PLUGIN_ENV = re.compile(r"^(TUNER|NET)/Plugin ?: Plugin name set by env to (\S+)")
_TUNER_USED = re.compile(r"^TUNER/Plugin ?: Using tuner plugin (\S+)|^TUNER/Plugin ?: .*using (internal) tuner")
_TRANSPORT = re.compile(
    r"\bvia (P2P/(?:direct pointer|[A-Za-z]+)|SHM|direct shared memory|NET/[^/\s]+|CollNet|COLLNET|NVLS)"
)
_PEER = re.compile(r"\b(\d+)\[([0-9a-fA-F]+)\] -> (\d+)\[([0-9a-fA-F]+)\]")
_NETWORK = re.compile(r"^Using network (.+)$")
_ASSIGNED_NET = re.compile(r"^Assigned NET plugin (.+?) to comm\b")  # NCCL 2.2x, before "Using network"
_TREES = re.compile(r"^Trees((?: \[\d+\] \S+)+)")
_TREE_ITEM = re.compile(r"\[(\d+)\] (\S+)")
_CHOICE = re.compile(
    r"(?:\b([A-Za-z]+): +)?(\d+) Bytes -> Algo +(\w+) +proto +(\w+)"
    r"(?: +channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\})?"
)
_COLL_CALL = re.compile(r"^(\w+): opCount \w+ .*?\bcount (\d+) datatype (\d+)")
_MSCCL = re.compile(r"\bMSCCL(?:\+\+|PP)?\b", re.I)
# ncclDataType_t sizes: int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 fp8 fp8
_TYPE_SIZE = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 10: 1, 11: 1}


def transport_name(raw: str) -> str:
    if raw in ("direct shared memory",) or raw.startswith("SHM"):
        return "SHM"
    if raw == "P2P/direct pointer":
        return "P2P/direct"
    if raw.upper() == "COLLNET":
        return "COLLNET"
    return raw


def tree(spec: str) -> dict[str, Any] | None:
    """One "[c] down->rank->up" item (2.5+: children first; 2.4: parent first)."""
    parts = spec.split("|", 1)[0].split("->")
    if len(parts) != 3:
        return None
    try:
        left, rank, right = parts[0], int(parts[1]), parts[2]
        if "/" not in left and "/" in right:
            left, right = right, left
        children = [int(c) for c in left.split("/") if int(c) >= 0]
        parent = int(right)
    except ValueError:
        return None
    return {"rank": rank, "parent": parent if parent >= 0 else None, "children": children}
