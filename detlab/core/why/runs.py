"""The items read from the runs' own records: their NCCL/RCCL logs (step 1), the environment on every rank
(step 2) and the stack and topology they ran on (step 4)."""

from __future__ import annotations

from typing import Any

from detlab.core import commlog
from detlab.core.configs import WORKER_OWNED, TorchFlags

from .facts import (
    FAIL,
    NOT_APPLICABLE,
    NOT_CHECKED,
    PASS,
    Item,
    RunFacts,
    WhyInput,
    comm_log,
    link,
    log_diff,
    pair_page,
    rank_envs,
    shown,
)

LOGS_TITLE = "Logs: algorithm, protocol and channels per rank, as NCCL/RCCL printed them"
ENV_TITLE = "Env parity: the same variables and collective library version on every rank of both runs"
STACK_TITLE = "Stack and topology: devices, driver, runtime, torch, backend, world size, rings and transports"
_CHANNEL_VARS = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_MAX_NCHANNELS", "NCCL_MAX_NRINGS", "NCCL_MAX_CTAS")
_STACK_FACTS = ("device", "driver", "cuda", "hip", "torch", "backend")
_LOG_TOPOLOGY = ("library", "nranks", "nnodes", "network", "transports", "ring_orders")
UNSET = "unset"


def _text(value: Any) -> str:
    if value is None:
        return UNSET
    if isinstance(value, list | tuple):
        return " | ".join(_text(v) for v in value) if value else "none"
    return str(value)


def _choice_name(key: str) -> str:
    """`choice.AllReduce.4` → `AllReduce 4 B`."""
    if not key.startswith("choice."):
        return key
    _, op, nbytes = key.split(".", 2)
    return f"{'' if op == '?' else op + ' '}{nbytes} B"


def _row(key: str, where: str, a: Any = "", b: Any = "") -> dict[str, Any]:
    return {"key": key, "where": where, "a": a if isinstance(a, str) else _text(a),
            "b": b if isinstance(b, str) else _text(b)}


def _side_row(run: RunFacts, key: str, where: str, value: str) -> dict[str, Any]:
    return _row(key, where, value, "") if run.side == "A" else _row(key, where, "", value)


def _backends(run: RunFacts) -> set[str]:
    return {e["backend"] for e in run.envs if e.get("backend")}


def _config_differs(data: WhyInput, names: tuple[str, ...] | None = None) -> list[str]:
    """NCCL/RCCL variables the two configs set differently (so a difference there was asked for)."""
    ea, eb = data.a.config.get("env") or {}, data.b.config.get("env") or {}
    return sorted(n for n in set(ea) | set(eb) if ea.get(n) != eb.get(n) and (names is None or n in names))


def _first_log(run: RunFacts) -> dict[str, str]:
    rank = min(run.logs)
    return link(f"run {run.run_id} ({run.side}) rank {rank} log", comm_log(run.run_id, rank))


def comm_log_item(data: WhyInput) -> Item:
    """Step 1: what the library printed it did, rank by rank between A and B and across each run's ranks."""
    a, b = data.a, data.b
    if not a.logs and not b.logs:
        if (_backends(a) | _backends(b)) == {"gloo"}:
            return Item("logs", LOGS_TITLE, NOT_APPLICABLE, "not applicable (gloo: no NCCL)",
                        [link("stack of the compared runs", pair_page(data, "environment"))])
        return Item("logs", LOGS_TITLE, NOT_CHECKED, "no logs recorded: neither run uploaded an NCCL/RCCL debug log "
                    "(NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING)")
    if not a.logs or not b.logs:
        have, lack = (a, b) if a.logs else (b, a)
        why = " (gloo: no NCCL)" if _backends(lack) == {"gloo"} else ""
        return Item("logs", LOGS_TITLE, NOT_CHECKED, f"no logs recorded for {lack.label}{why}; {have.side} has "
                    f"rank(s) {shown(sorted(have.logs))}", [_first_log(have)])
    rows: list[dict[str, Any]] = []
    compared: set[tuple[Any, int]] = set()  # (op, bytes) logged by both runs on some rank
    for rank in sorted(set(a.logs) & set(b.logs)):
        for d in commlog.diff_facts(a.logs[rank], b.logs[rank]):
            # A size only one side logged is not compared (a truncated log, another workload's calls).
            if (d["key"] == "nchannels" or d["key"].startswith("choice.")) and None not in (d["a"], d["b"]):
                rows.append(_row(_choice_name(d["key"]), f"A vs B, rank {rank}", d["a"], d["b"]))
        compared |= ({(c.get("op"), c["bytes"]) for c in b.logs[rank].get("choices") or []}
                     & {(c.get("op"), c["bytes"]) for c in a.logs[rank].get("choices") or []})
    for run in (a, b):
        found = commlog.check_effective(run.config.get("env") or {}, [run.logs[r] for r in sorted(run.logs)])
        for f in found:
            if f["kind"] == "rank-parity" and f["key"].startswith("choice."):
                rows.append(_side_row(run, _choice_name(f["key"]), f"across {run.side}'s ranks", _text(f["effective"])))
            elif f["kind"] == "not-honoured" and f["key"] in _CHANNEL_VARS:
                rows.append(_side_row(run, f["key"], f"{run.side} asked {f['requested']}", _text(f["effective"])))
    evidence = [link(f"log diff of runs {a.run_id} and {b.run_id}", log_diff(a.run_id, b.run_id)),
                _first_log(a), _first_log(b)]
    ranks = len(set(a.logs) | set(b.logs))
    if rows:
        first = rows[0]
        line = f"{first['key']} differs ({first['where']}): {first['a'] or '—'} vs {first['b'] or '—'}"
        more = f"; {len(rows) - 1} more difference(s)" if len(rows) > 1 else ""
        asked = _config_differs(data, _CHANNEL_VARS)
        note = f" (their configs set {', '.join(asked)} differently)" if asked else ""
        return Item("logs", LOGS_TITLE, FAIL, line + more + note, evidence, rows, len(rows))
    if compared:
        return Item("logs", LOGS_TITLE, PASS, f"the same algorithm, protocol and channels for {len(compared)} logged "
                    f"size(s) on {ranks} rank log(s) of both runs", evidence)
    return Item("logs", LOGS_TITLE, NOT_CHECKED, "the logs show no algorithm/protocol choice by size to compare "
                "(NCCL_DEBUG_SUBSYS without TUNING, or one-rank communicators); channels agree", evidence)


def _by_rank(run: RunFacts, value: Any) -> dict[int, Any]:
    return {int(e.get("rank", i)): value(e) for i, e in enumerate(run.envs)}


def _uniform(values: dict[int, Any]) -> tuple[bool, Any]:
    distinct = {_text(v) for v in values.values()}
    return len(distinct) == 1, next(iter(values.values())) if values else None


def _parity_rows(a: RunFacts, b: RunFacts, facts: dict[str, Any]) -> list[dict[str, Any]]:
    """For each fact (name → how to read it from a rank's env): rows where ranks of one run disagree, and where
    the runs (each uniform) disagree."""
    rows = []
    for name, read in facts.items():
        sides = {}
        for run in (a, b):
            values = _by_rank(run, read)
            same, value = _uniform(values)
            if not same:
                rows.append(_side_row(run, name, f"across {run.side}'s ranks",
                                      " · ".join(f"rank {r}: {_text(v)}" for r, v in sorted(values.items()))))
            sides[run.side] = (same, value)
        if sides["A"][0] and sides["B"][0] and _text(sides["A"][1]) != _text(sides["B"][1]):
            rows.append(_row(name, "A vs B", sides["A"][1], sides["B"][1]))
    return rows


def _env_facts(a: RunFacts, b: RunFacts) -> dict[str, Any]:
    names = sorted({n for run in (a, b) for e in run.envs for n in (e.get("effective_env") or {})} - WORKER_OWNED)
    facts: dict[str, Any] = {n: (lambda e, n=n: (e.get("effective_env") or {}).get(n)) for n in names}
    flags = sorted({k for run in (a, b) for e in run.envs for k in (e.get("torch_flags") or {})})
    facts |= {f"torch.{k}": (lambda e, k=k: (e.get("torch_flags") or {}).get(k)) for k in flags}
    facts["collective library version"] = lambda e: e.get("nccl")
    return facts


def _asked(data: WhyInput) -> dict[str, tuple[str | None, str | None]]:
    """What the two configs set differently, by fact name: (A's value, B's value) as the facts show them, None
    where the config does not say what the rank will see (threads left to the machine)."""
    a, b = data.a.config, data.b.config
    asked: dict[str, tuple[str | None, str | None]] = {}
    ea, eb = a.get("env") or {}, b.get("env") or {}
    for name in _config_differs(data):
        asked[name] = (_text(ea.get(name)), _text(eb.get(name)))
    defaults = {k: f.default for k, f in TorchFlags.model_fields.items()}
    ta, tb = {**defaults, **(a.get("torch") or {})}, {**defaults, **(b.get("torch") or {})}
    for flag in defaults:
        if ta[flag] != tb[flag]:
            asked[f"torch.{flag}"] = (_text(ta[flag]), _text(tb[flag]))
    if a.get("threads") != b.get("threads"):
        threads = tuple(None if t is None else str(t) for t in (a.get("threads"), b.get("threads")))
        asked["torch.num_threads"] = asked["OMP_NUM_THREADS"] = threads  # type: ignore[assignment]
    return asked


def _intended(row: dict[str, Any], asked: dict[str, tuple[str | None, str | None]]) -> bool:
    """A difference between the runs that their configs asked for, and got: the experiment, not a fault."""
    if row["where"] != "A vs B" or row["key"] not in asked:
        return False
    return all(want is None or want == got for want, got in zip(asked[row["key"]], (row["a"], row["b"]), strict=True))


def env_parity_item(data: WhyInput) -> Item:
    """Step 2: every rank of both runs ran with the same variables, torch flags and collective library version,
    apart from the differences their configs ask for (those are the experiment: listed, never a failure)."""
    a, b = data.a, data.b
    evidence = [link(f"run {r.run_id} ({r.side}) env per rank", rank_envs(r.run_id)) for r in (a, b)]
    lacking = [r for r in (a, b) if not r.envs]
    if lacking:
        return Item("env", ENV_TITLE, NOT_CHECKED,
                    f"no environment recorded for {' or '.join(r.label for r in lacking)}", evidence)
    facts = _env_facts(a, b)
    rows = _parity_rows(a, b, facts)
    # The library's own word on its version, where logs exist (a rank may load another libnccl than torch reports).
    logged = {run.side: sorted({v for log in run.logs.values() for v in (log.get("versions") or [])}) for run in (a, b)}
    if logged["A"] and logged["B"] and logged["A"] != logged["B"]:
        rows.append(_row("logged library version", "A vs B", logged["A"], logged["B"]))
    asked = _asked(data)
    intended = [{**r, "where": "A vs B, as their configs ask"} for r in rows if _intended(r, asked)]
    rows = [r for r in rows if not _intended(r, asked)]
    also = f"; their configs' own difference(s) besides: {shown([r['key'] for r in intended])}" if intended else ""
    if rows:
        first = rows[0]
        ea, eb = a.config.get("env") or {}, b.config.get("env") or {}
        why = f" (their configs ask A: {ea.get(first['key'], UNSET)}, B: {eb.get(first['key'], UNSET)})" \
            if first["key"] in _config_differs(data) else ""
        line = f"{first['key']} differs ({first['where']}): {first['a'] or '—'} vs {first['b'] or '—'}{why}"
        more = f"; {len(rows) - 1} more: {shown([r['key'] for r in rows[1:]])}" if len(rows) > 1 else ""
        return Item("env", ENV_TITLE, FAIL, line + more + also, evidence, rows + intended, len(rows) + len(intended))
    ranks = len(a.envs) + len(b.envs)
    if intended:
        differs = ", ".join(f"{r['key']} (A: {r['a']}, B: {r['b']})" for r in intended[:3])
        more = f" and {len(intended) - 3} more" if len(intended) > 3 else ""
        return Item("env", ENV_TITLE, PASS, f"only the differences their configs ask for: {differs}{more}; the other "
                    f"{len(facts) - len(intended)} variables, torch flags and library version equal on all {ranks} "
                    "ranks of both runs", evidence, intended, len(intended))
    return Item("env", ENV_TITLE, PASS, f"{len(facts)} variables, torch flags and library version equal on all "
                f"{ranks} ranks of both runs", evidence)


def stack_item(data: WhyInput) -> Item:
    """Step 4: the hardware and software stack, the world size and, where logs exist, the rings and transports."""
    a, b = data.a, data.b
    evidence = [link("stack of the compared runs", pair_page(data, "environment"))]
    lacking = [r for r in (a, b) if not r.envs]
    if lacking:
        return Item("stack", STACK_TITLE, NOT_CHECKED,
                    f"no stack recorded for {' or '.join(r.label for r in lacking)}", evidence)
    rows = _parity_rows(a, b, {k: (lambda e, k=k: e.get(k)) for k in _STACK_FACTS})
    if a.world_size != b.world_size:
        rows.append(_row("world size", "A vs B", str(a.world_size), str(b.world_size)))
    topology = "no NCCL/RCCL logs: rings and transports not compared"
    if a.logs and b.logs:
        evidence.append(link(f"log diff of runs {a.run_id} and {b.run_id}", log_diff(a.run_id, b.run_id)))
        topology = "rings and transports equal in the logs"
        for rank in sorted(set(a.logs) & set(b.logs)):
            rows += [_row(d["key"], f"A vs B, rank {rank}", d["a"], d["b"])
                     for d in commlog.diff_facts(a.logs[rank], b.logs[rank]) if d["key"] in _LOG_TOPOLOGY]
            trees = [log.get("tree_orders") or [] for log in (a.logs[rank], b.logs[rank])]
            if trees[0] != trees[1]:
                rows.append(_row("tree_orders", f"A vs B, rank {rank}", trees[0], trees[1]))
    hosts = sorted({e.get("host") or "?" for run in (a, b) for e in run.envs})
    on = f"on host(s) {shown(hosts)}"
    if rows:
        first = rows[0]
        line = f"{first['key']} differs ({first['where']}): {first['a'] or '—'} vs {first['b'] or '—'}"
        more = f"; {len(rows) - 1} more: {shown([r['key'] for r in rows[1:]])}" if len(rows) > 1 else ""
        return Item("stack", STACK_TITLE, FAIL, f"{line}{more} ({on})", evidence, rows, len(rows))
    device = a.device() or "unknown device"
    return Item("stack", STACK_TITLE, PASS, f"the same {device}, driver, runtime, torch and backend on every rank, "
                f"world size {a.world_size}, {on}; {topology}", evidence)
