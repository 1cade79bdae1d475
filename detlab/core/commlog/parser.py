"""Facts from one NCCL/RCCL debug log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING)."""

from __future__ import annotations

import re
from typing import Any

from .lines import Record, records
from .names import algo_name, proto_name
from .patterns import (
    _ASSIGNED_NET,
    _CHOICE,
    _COLL_CALL,
    _COLL_CHANNELS,
    _COMM,
    _COMM_TOPO,
    _ENV_SET,
    _ENV_SET_SHORT,
    _INTERNAL_NET,
    _INVALID_VALUE,
    _INVALID_WORDS,
    _MSCCL,
    _NETWORK,
    _NNODES,
    _NRANKS,
    _PEER,
    _PLUGIN_ENV,
    _RCCL_COMM_SUFFIX,
    _RING_CONN,
    _RING_ORDER,
    _ROCM_BANNER,
    _TESTS_RANK,
    _TRANSPORT,
    _TREE_ITEM,
    _TREES,
    _TUNER_USED,
    _TYPE_SIZE,
    _VAR,
    _VERSION,
    transport_name,
    tree,
)


def empty_result() -> dict[str, Any]:
    """The result for a log that says nothing: every key present, every fact unknown."""
    return {
        "library": None, "version": None, "versions": [], "hip_version": None, "rocm_version": None,
        "nranks": None, "nnodes": None, "ranks": [], "processes": [], "nchannels": None,
        "transports": [], "network": None, "env": {}, "env_by_process": {}, "invalid_env": [],
        "choices": [], "warnings": [], "msccl": [], "init_complete": False, "nvls_channels": None, "tuner": None,
        "ring_orders": [], "tree_orders": [],
    }


def parse(text: str) -> dict[str, Any]:
    """Parse one NCCL/RCCL debug log (or several processes' logs interleaved) into plain facts.

    Never raises: text that is not a log gives `empty_result()`.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if not isinstance(text, str):
        return empty_result()
    try:
        state = _State()
        for rec in records(text):
            state.feed(rec)
        return state.result()
    except Exception:  # noqa: BLE001 - a log from the wild must never take the caller down
        return empty_result()


def _tests_bus_id(raw: str) -> str:
    """nccl-tests' "[0x18]" as printed, and its "[0000:18:00]" as NCCL prints busIds ("18000")."""
    if ":" not in raw:
        return raw.lower()
    domain, bus, device = raw.lower().split(":")
    return f"{int(domain, 16):x}{bus}{device}0".lstrip("0") if int(domain, 16) else f"{bus}{device}0".lstrip("0")


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """(2, 27, 7) for "2.27.7"; None when unknown."""
    if not version:
        return None
    return tuple(int(p) for p in version.split("."))


class _State:
    def __init__(self) -> None:
        self.res = empty_result()
        self.nccl_seen = False
        self.rccl_seen = False
        self.ranks: dict[int, dict[str, Any]] = {}
        self.processes: set[str] = set()
        self.nranks: list[int] = []
        self.nnodes: list[int] = []
        self.coll_channels: list[int] = []
        self.rings: dict[int, list[int]] = {}
        self.ring_totals: list[int] = []
        self.ring_conns: set[int] = set()
        self.nvls_channels: list[int] = []
        self.trees: dict[tuple[int, int], dict[str, Any]] = {}
        self.transports: list[str] = []
        self.networks: list[str] = []
        self.ib_found = self.socket_found = self.ib_failed = False
        self.peers: list[tuple[int, str]] = []
        self.raw_choices: list[tuple[str | None, int, str, str, tuple[int, int] | None]] = []
        self.last_call: dict[str | None, tuple[str, int]] = {}

    def feed(self, rec: Record) -> None:
        msg = rec.msg
        if rec.level != "TEXT":
            self.nccl_seen = True
        if rec.process:
            self.processes.add(rec.process)
        if rec.src and "hipify" in rec.src:
            self.rccl_seen = True
        if rec.level in ("WARN", "ABORT"):
            if msg and msg not in self.res["warnings"]:
                self.res["warnings"].append(msg)
            self._invalid(rec)
            return
        if rec.level == "TEXT":
            self._text(msg)
            return
        for handler in (self._version, self._env, self._comm, self._layout, self._choice, self._misc):
            if handler(rec):
                return

    def _text(self, msg: str) -> None:
        if self._version_text(msg):
            return
        m = _ROCM_BANNER.match(msg)
        if m:
            self.rccl_seen = True
            self.res["hip_version" if m[1] == "HIP" else "rocm_version"] = m[2]
            return
        m = _TESTS_RANK.search(msg)
        if m:
            self._rank(int(m[1]), host=m[3], pid=int(m[2]), device=int(m[4]), bus_id=_tests_bus_id(m[5]))

    def _version_text(self, msg: str) -> bool:
        m = _VERSION.search(msg)
        if not m:
            return False
        if m[1] == "RCCL":
            self.rccl_seen = True
        else:
            self.nccl_seen = True
        if m[2] not in self.res["versions"]:
            self.res["versions"].append(m[2])
        return True

    def _version(self, rec: Record) -> bool:
        return self._version_text(rec.msg)

    def _env(self, rec: Record) -> bool:
        msg = rec.msg
        m = _PLUGIN_ENV.match(msg)
        if m:
            # "TUNER/Plugin: Plugin name set by env to X" is how NCCL echoes NCCL_TUNER_PLUGIN (NET: NCCL_NET_PLUGIN)
            self._set_env(rec, f"NCCL_{m[1]}_PLUGIN", m[2], echo=True)
            return True
        m = _ENV_SET.match(msg) or _ENV_SET_SHORT.match(msg)
        if m:
            name, value = m[1], m[2].strip()
            if value.endswith(".") and m.re is _ENV_SET:
                value = value[:-1]
            if name.startswith(("RCCL", "MSCCL")):
                self.rccl_seen = True
            self._set_env(rec, name, value, echo=m.re is _ENV_SET)
            return True
        return self._invalid(rec)

    def _set_env(self, rec: Record, name: str, value: str, *, echo: bool) -> None:
        # "set by environment to" is the echo; "X set to" may be a derived value, kept only when no echo is
        if echo or name not in self.res["env"]:
            self.res["env"][name] = value
        proc = self.res["env_by_process"].setdefault(rec.process or "?", {})
        if echo or name not in proc:
            proc[name] = value

    def _invalid(self, rec: Record) -> bool:
        msg = rec.msg
        m = _INVALID_VALUE.search(msg)
        if m:
            notice = {"var": m[2], "value": m[1], "text": msg}
        elif _INVALID_WORDS.search(msg) and _VAR.search(msg):
            var = _VAR.search(msg)
            notice = {"var": var[1] if var else None, "value": None, "text": msg}
        else:
            return False
        if notice not in self.res["invalid_env"]:
            self.res["invalid_env"].append(notice)
        return True

    def _comm(self, rec: Record) -> bool:
        msg = rec.msg
        m = _COMM.search(msg)
        if m:
            self._rank(int(m[1]), host=rec.host, pid=rec.pid, device=int(m[3]), bus_id=m[4] and m[4].lower())
        topo = _COMM_TOPO.match(msg)
        if topo:
            self._rank(int(topo[1]), host=rec.host, pid=rec.pid, device=rec.dev)
        for n in _NRANKS.findall(msg):
            self.nranks.append(int(n))
        for n in _NNODES.findall(msg):
            self.nnodes.append(int(n))
        if re.search(r"Init COMPLETE|- COMPLETE", msg):
            self.res["init_complete"] = True
        return bool(m)

    def _layout(self, rec: Record) -> bool:
        msg = _RCCL_COMM_SUFFIX.sub("", rec.msg)
        m = _RING_ORDER.match(msg)
        if m:
            self.rings.setdefault(int(m[1]), [int(x) for x in m[3].split()])
            if m[2] is not None:
                self.ring_totals.append(int(m[2]))
            return True
        m = _COLL_CHANNELS.match(msg)
        if m:
            self.coll_channels.append(int(m[1]))
            if m[2] is not None:
                self.nvls_channels.append(int(m[2]))
            return True
        m = _TRANSPORT.search(msg)
        if m:
            ring = _RING_CONN.match(msg)
            if ring:
                self.ring_conns.add(int(ring[1]))
            self.transports.append(transport_name(m[1]))
            for a, ab, b, bb in _PEER.findall(msg):
                self.peers += [(int(a), ab.lower()), (int(b), bb.lower())]
            return True
        m = _TREES.match(msg)
        if m:
            for channel, spec in _TREE_ITEM.findall(m[1]):
                parsed_tree = tree(spec)
                if parsed_tree is not None:
                    key = (parsed_tree["rank"], int(channel))
                    self.trees.setdefault(key, {"channel": int(channel), **parsed_tree})
            return True
        return False

    def _choice(self, rec: Record) -> bool:
        msg = rec.msg
        m = _COLL_CALL.match(msg)
        if m:
            size = _TYPE_SIZE.get(int(m[3]))
            if size:
                self.last_call[rec.process] = (m[1], int(m[2]) * size)
            return True
        m = _CHOICE.search(msg)
        if not m:
            return False
        op, nbytes = m[1], int(m[2])
        if op is None and rec.process in self.last_call:
            call_op, call_bytes = self.last_call[rec.process]
            op = call_op if call_bytes == nbytes else None
        channels = (int(m[5]), int(m[6])) if m[5] is not None else None
        self.raw_choices.append((op, nbytes, m[3], m[4], channels))
        return True

    def _misc(self, rec: Record) -> bool:
        msg = rec.msg
        m = _NETWORK.match(msg)
        if m:
            self.networks.append(m[1].strip())
            return True
        m = _ASSIGNED_NET.match(msg) or _INTERNAL_NET.match(msg)
        if m:
            self.networks.append(m[1])
            return True
        m = _TUNER_USED.match(msg)
        if m:
            self.res["tuner"] = m[1] or m[2]
            return True
        if re.match(r"NET/IB ?: Using \[\d", msg):  # "Using [RO]; OOB .." lists no device
            self.ib_found = True
        elif re.match(r"NET/IB ?: No device found|Failed to initialize NET plugin IB\b", msg):
            # NCCL >= 2.2x still prints "NET/IB : Using [RO]; OOB ..." before giving up on IB
            self.ib_failed = True
        elif re.match(r"NET/Socket ?: Using \[?", msg):
            self.socket_found = True
        elif _MSCCL.search(msg) and not re.search(r"disabl|not enabled", msg, re.I):
            self.rccl_seen = True
            if msg not in self.res["msccl"]:
                self.res["msccl"].append(msg)
        if "librccl" in msg:
            self.rccl_seen = True
        return False

    def _rank(self, rank: int, **fields: Any) -> None:
        entry = self.ranks.setdefault(
            rank, {"rank": rank, "host": None, "pid": None, "device": None, "bus_id": None}
        )
        for key, value in fields.items():
            if entry[key] is None and value is not None:
                entry[key] = value

    def result(self) -> dict[str, Any]:
        res = self.res
        res["version"] = res["versions"][0] if res["versions"] else None
        version = version_tuple(res["version"])
        if self.rccl_seen:
            res["library"] = "RCCL"
        elif self.nccl_seen:
            res["library"] = "NCCL"
        self._peer_ranks(version)
        res["ranks"] = [self.ranks[r] for r in sorted(self.ranks)]
        res["processes"] = sorted(self.processes)
        res["nranks"] = max(self.nranks) if self.nranks else None
        res["nnodes"] = self._nnodes(res["nranks"])
        if self.coll_channels:
            res["nchannels"] = max(self.coll_channels)
        elif self.ring_totals:
            res["nchannels"] = max(self.ring_totals)
        elif self.rings:
            res["nchannels"] = len(self.rings)
        elif self.ring_conns:
            # Before 2.6 no line states the count; every ring's connections are printed as "Ring NN : a -> b".
            res["nchannels"] = max(self.ring_conns) + 1
        res["nvls_channels"] = max(self.nvls_channels) if self.nvls_channels else None
        res["transports"] = list(dict.fromkeys(self.transports))
        res["network"] = self._network()
        res["ring_orders"] = [{"channel": c, "order": self.rings[c]} for c in sorted(self.rings)]
        res["tree_orders"] = [self.trees[k] for k in sorted(self.trees, key=lambda k: (k[1], k[0]))]
        res["choices"] = self._choices(version)
        return res

    def _peer_ranks(self, version: tuple[int, ...] | None) -> None:
        # The bracket after a rank in "0[84000] -> 1[85000]" is the busId up to 2.18 and the
        # CUDA device from 2.19; without a version, hex digits or width give it away.
        if version is not None:
            as_bus = version < (2, 19)
        else:
            as_bus = any(len(v) >= 4 or re.search(r"[a-f]", v) for _, v in self.peers)
        for rank, value in self.peers:
            if as_bus:
                self._rank(rank, bus_id=value)
            else:
                self._rank(rank, device=int(value, 16) if not value.isdigit() else int(value))

    def _nnodes(self, nranks: int | None) -> int | None:
        if self.nnodes:
            return max(self.nnodes)
        hosts = [r["host"] for r in self.ranks.values()]
        if nranks and len(self.ranks) == nranks and all(hosts):
            return len(set(hosts))
        return None

    def _network(self) -> str | None:
        if self.networks:
            return self.networks[0]
        nets = [t.split("/", 1)[1] for t in self.transports if t.startswith("NET/")]
        if nets:
            return nets[0]
        if self.ib_found and not self.ib_failed:
            return "IB"
        if self.socket_found:
            return "Socket"
        return None

    def _choices(self, version: tuple[int, ...] | None) -> list[dict[str, Any]]:
        seen: dict[tuple[Any, ...], dict[str, Any]] = {}
        for op, nbytes, algo, proto, channels in self.raw_choices:
            by_number = algo.isdigit() and proto.isdigit()
            choice = {
                "op": op, "bytes": nbytes,
                "algo": algo_name(int(algo) if by_number else algo, version),
                "proto": proto_name(int(proto) if by_number else proto),
                "channels": list(channels) if channels else None,
                "printed": "number" if by_number else "name",
            }
            key = (op, nbytes, choice["algo"], choice["proto"], channels)
            if key in seen:
                seen[key]["count"] += 1
            else:
                seen[key] = {**choice, "count": 1}
        return list(seen.values())
