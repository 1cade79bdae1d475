"""Compare parsed logs: two runs' facts, and requested settings against what the library did."""

from __future__ import annotations

from typing import Any

from .names import allowed

_SCALARS = ["library", "version", "nranks", "nnodes", "nchannels", "network"]
# Variables NCCL reads before logging is set up, or never echoes.
_NEVER_ECHOED = {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "NCCL_DEBUG_TIMESTAMP_FORMAT"}
_MAX_CHANNEL_VARS = ("NCCL_MAX_NCHANNELS", "NCCL_MAX_NRINGS", "NCCL_MAX_CTAS")


def _choice_map(parsed: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, set[str]] = {}
    for c in parsed.get("choices") or []:
        ch = c.get("channels")
        desc = f"{c['algo']}/{c['proto']}" + (f"/{ch[0]}..{ch[1]}" if ch else "")
        out.setdefault(f"choice.{c.get('op') or '?'}.{c['bytes']}", set()).add(desc)
    return {k: sorted(v) for k, v in out.items()}


def diff_facts(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Facts that differ between two parsed logs, as [{"key", "a", "b"}].

    Keys: the scalar facts, "transports", "ring_orders", "env.<NAME>" and
    "choice.<op>.<bytes>" (the algo/proto/channels chosen for that size).
    """
    diffs: list[dict[str, Any]] = []
    for key in _SCALARS:
        if a.get(key) != b.get(key):
            diffs.append({"key": key, "a": a.get(key), "b": b.get(key)})
    ta, tb = sorted(a.get("transports") or []), sorted(b.get("transports") or [])
    if ta != tb:
        diffs.append({"key": "transports", "a": ta, "b": tb})
    if (a.get("ring_orders") or []) != (b.get("ring_orders") or []):
        diffs.append({"key": "ring_orders", "a": a.get("ring_orders"), "b": b.get("ring_orders")})
    ea, eb = a.get("env") or {}, b.get("env") or {}
    for name in sorted(set(ea) | set(eb)):
        if ea.get(name) != eb.get(name):
            diffs.append({"key": f"env.{name}", "a": ea.get(name), "b": eb.get(name)})
    ca, cb = _choice_map(a), _choice_map(b)
    for key in sorted(set(ca) | set(cb), key=_choice_sort):
        if ca.get(key) != cb.get(key):
            diffs.append({"key": key, "a": ca.get(key), "b": cb.get(key)})
    return diffs


def _choice_sort(key: str) -> tuple[str, int]:
    _, op, nbytes = key.split(".", 2)
    return op, int(nbytes) if nbytes.isdigit() else -1


def _same_value(requested: str, echoed: str) -> bool:
    r, e = requested.strip().lower(), echoed.strip().lower()
    if r == e:
        return True
    try:
        return int(r, 0) == int(e, 0)
    except ValueError:
        return False


def check_effective(requested_env: dict[str, str], parsed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Flag where the logs show requested NCCL/RCCL settings were not what the library used.

    Kinds: "not-honoured" (NCCL_ALGO/NCCL_PROTO/max channels contradicted by the choices, or an
    echoed value differing from the request), "not-echoed", "invalid", "msccl" and
    "rank-parity" (version, env or choices differing between ranks/processes).
    """
    findings: list[dict[str, Any]] = []
    requested = {k: str(v) for k, v in (requested_env or {}).items()}
    findings += _algo_proto(requested, parsed)
    findings += _channels(requested, parsed)
    findings += _echoes(requested, parsed)
    findings += _invalid(parsed)
    findings += _msccl(requested, parsed)
    findings += _parity(parsed)
    return findings


def _algo_proto(requested: dict[str, str], parsed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for var, kind in (("NCCL_ALGO", "algo"), ("NCCL_PROTO", "proto")):
        if var not in requested:
            continue
        bad: dict[str, list[dict[str, Any]]] = {}
        for log in parsed:
            for choice in log.get("choices") or []:
                ok = allowed(kind, requested[var], choice.get("op"))
                if ok is not None and choice[kind] not in ok:
                    bad.setdefault(choice[kind], []).append(choice)
        if bad:
            examples = [f"{c.get('op') or '?'} {c['bytes']} B" for cs in bad.values() for c in cs[:1]]
            out.append({
                "kind": "not-honoured", "key": var, "requested": requested[var], "effective": sorted(bad),
                "detail": f"{var}={requested[var]} requested but the log shows {', '.join(sorted(bad))} "
                          f"(e.g. {'; '.join(examples)})",
            })
    return out


def _channels(requested: dict[str, str], parsed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for var in _MAX_CHANNEL_VARS:
        try:
            limit = int(requested[var], 0)
        except (KeyError, ValueError):
            continue
        used: set[int] = set()
        for log in parsed:
            if log.get("nchannels") is not None and log["nchannels"] > limit:
                used.add(log["nchannels"])
            for c in log.get("choices") or []:
                if c.get("channels") and c["channels"][1] - c["channels"][0] + 1 > limit:
                    used.add(c["channels"][1] - c["channels"][0] + 1)
        if used:
            out.append({
                "kind": "not-honoured", "key": var, "requested": requested[var], "effective": sorted(used),
                "detail": f"{var}={limit} requested but {max(used)} channels were used",
            })
    return out


def _echoes(requested: dict[str, str], parsed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    echoed: dict[str, set[str]] = {}
    for log in parsed:
        for name, value in (log.get("env") or {}).items():
            echoed.setdefault(name, set()).add(value)
    # A one-rank communicator runs no algorithm, and NCCL 2.28 echoes no NCCL_ALGO/NCCL_PROTO for it
    # (measured on an H200): their silence there says nothing.
    single_rank = bool(parsed) and all(log.get("nranks") == 1 for log in parsed)
    for name, value in sorted(requested.items()):
        if not name.startswith(("NCCL_", "RCCL_", "MSCCL")) or name in _NEVER_ECHOED:
            continue
        if single_rank and name in ("NCCL_ALGO", "NCCL_PROTO"):
            continue
        if name not in echoed:
            out.append({
                "kind": "not-echoed", "key": name, "requested": value, "effective": None,
                "detail": f"{name} was requested but no log says it was set by environment "
                          "(misspelt, not exported to the ranks, or NCCL_DEBUG_SUBSYS lacks ENV)",
            })
        elif not all(_same_value(value, e) for e in echoed[name]):
            out.append({
                "kind": "not-honoured", "key": name, "requested": value, "effective": sorted(echoed[name]),
                "detail": f"{name}={value} requested but the library echoed {', '.join(sorted(echoed[name]))}",
            })
    return out


def _invalid(parsed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for log in parsed:
        for notice in log.get("invalid_env") or []:
            finding = {
                "kind": "invalid", "key": notice.get("var"), "requested": notice.get("value"),
                "effective": None, "detail": notice.get("text"),
            }
            if finding not in out:
                out.append(finding)
    return out


def _msccl(requested: dict[str, str], parsed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    lines = [line for log in parsed for line in log.get("msccl") or []]
    if not lines:
        return []
    asked = {k: v for k, v in requested.items() if "MSCCL" in k}
    finding: dict[str, Any] = {
        "kind": "msccl", "key": next(iter(sorted(asked)), "RCCL_MSCCL_ENABLE"),
        "requested": asked or None, "effective": sorted(set(lines)),
        "detail": "RCCL took an MSCCL/MSCCL++ path, which replaces the NCCL_ALGO/NCCL_PROTO choice",
    }
    return [finding]


def _parity(parsed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    versions = sorted({v for log in parsed for v in (log.get("versions") or [])})
    if len(versions) > 1:
        out.append({"kind": "rank-parity", "key": "version", "requested": None, "effective": versions,
                    "detail": f"ranks run different library versions: {', '.join(versions)}"})
    envs = [env for log in parsed for env in (log.get("env_by_process") or {}).values()]
    for name in sorted({n for env in envs for n in env}):
        values = {env.get(name) for env in envs}
        if len(values) > 1:
            shown = sorted(v if v is not None else "<unset>" for v in values)
            out.append({"kind": "rank-parity", "key": name, "requested": None, "effective": shown,
                        "detail": f"{name} differs between processes: {', '.join(shown)}"})
    maps = [_choice_map(log) for log in parsed]
    for key in sorted({k for m in maps for k in m}, key=_choice_sort):
        values = {tuple(m[key]) for m in maps if key in m}
        if len(values) > 1:
            shown = sorted(" | ".join(v) for v in values)
            out.append({"kind": "rank-parity", "key": key, "requested": None, "effective": shown,
                        "detail": f"{key} chosen differently across logs: {'; '.join(shown)}"})
    return out
