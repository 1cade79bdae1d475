"""Bisect: where in one training step two runs first part, module by module. Pure; no torch, no database.

A `bisect` run replays a train run up to its probe step (the pair's first divergent step) and records that step
as one tensor list of *entries*, in the order the step produced them (detlab/tensors/probe.py):

    state:MOD                 MOD's own parameters and buffers as the step starts (one entry per module, in
                              named_modules order: the module tree; the dtype field holds the module's class)
    fwd:MOD#K:inI / :outI     call K of MOD's forward: its I-th input tensor at the call's start, output at its end
    loss                      the loss the workload computed from the model's output
    bwd:MOD#K:goutI / :ginI   call K of MOD's backward: the gradient w.r.t. its I-th output as it starts (the
                              backward call's input), w.r.t. its I-th input as it ends (the call's output)
    grad:PARAM                the parameter's gradient after backward (after DDP's all-reduce)
    param:PARAM               the parameter after the optimizer step (and any injected fault)

The two runs' step records then compare with the train comparator unchanged; this module reads the differing
entries: the first in execution order, the first module call among them, whether that call's inputs matched
(it introduced the difference) or not (it carried it), and the module tree with each module's status.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from detlab.core.shards import DIGEST_BYTES

Phase = Literal["state", "forward", "loss", "backward", "grad", "update"]
PREFIX: dict[str, Phase] = {"state": "state", "fwd": "forward", "bwd": "backward", "grad": "grad",
                            "param": "update"}
ROOT = "(model)"  # how the root module (qualified name "") is shown
INPUT_SLOTS = ("in", "gout")  # a forward call's inputs; a backward call's inputs are the output gradients
EQUAL, DIFFERS, FIRST, NOT_CALLED = "equal", "differs", "first difference", "not called"
STATUSES = (EQUAL, DIFFERS, FIRST, NOT_CALLED)


@dataclass(frozen=True, slots=True)
class Entry:
    """One parsed entry name: its phase, the module (or parameter) it is about, the call number and the slot."""

    phase: Phase
    name: str  # module qualified name ("" for the root) or parameter name; "" for the loss
    call: int | None = None
    slot: str | None = None  # "in0", "out1", "gout0", "gin0"

    @property
    def is_input(self) -> bool:
        return self.slot is not None and self.slot.rstrip("0123456789") in INPUT_SLOTS


def call_entry(phase: Literal["fwd", "bwd"], module: str, call: int, slot: str) -> str:
    """The entry name of one tensor of one module call (the rank program and the report share it)."""
    return f"{phase}:{module}#{call}:{slot}"


def parse(name: str) -> Entry:
    """An entry name back into its parts (ValueError for a name no probe writes)."""
    if name == "loss":
        return Entry("loss", "")
    prefix, sep, rest = name.partition(":")
    if not sep or prefix not in PREFIX:
        raise ValueError(f"not a bisect entry: {name!r}")
    if prefix in ("fwd", "bwd"):
        head, sep, slot = rest.rpartition(":")
        module, hash_, call = head.rpartition("#")
        if not sep or not hash_ or not call.isdigit():
            raise ValueError(f"not a module call entry: {name!r}")
        return Entry(PREFIX[prefix], module, int(call), slot)
    return Entry(PREFIX[prefix], rest)


def shown(module: str) -> str:
    return module or ROOT


def call_list_difference(a: list[tuple[str, list[int], str]], b: list[tuple[str, list[int], str]]) -> str | None:
    """Where two runs' entry lists (name, shape, dtype) first part, in words; None when they are the same.

    Different lists mean the runs did not execute the same module calls in the same order (data-dependent
    control flow, another model): no call can be matched to a call, so the pair is incomparable."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            what = "call" if x[0] != y[0] else "shape or dtype"
            return (f"the runs' module calls part at entry {i} ({what}): {x[0]} {x[2]}{x[1]} in A, "
                    f"{y[0]} {y[2]}{y[1]} in B")
    if len(a) != len(b):
        longer, which = (a, "A") if len(a) > len(b) else (b, "B")
        return f"run {which} records more module calls: entry {min(len(a), len(b))} is {longer[min(len(a), len(b))][0]}"
    return None


def differing_by_rank(a: dict[int, bytes], b: dict[int, bytes]) -> dict[int, list[int]]:
    """Per rank both runs recorded: the entry indices whose digests differ (packed DIGEST_BYTES each)."""
    out = {}
    for rank in sorted(a.keys() & b.keys()):
        x = np.frombuffer(a[rank], dtype=np.uint8).reshape(-1, DIGEST_BYTES)
        y = np.frombuffer(b[rank], dtype=np.uint8).reshape(-1, DIGEST_BYTES)
        if x.shape != y.shape:
            raise ValueError(f"rank {rank}: {len(x)} digests in A, {len(y)} in B")
        out[rank] = [int(i) for i in np.nonzero((x != y).any(axis=1))[0]]
    return out


def _ancestors(module: str) -> list[str]:
    """The modules enclosing `module`, innermost first, the root last."""
    parts = module.split(".") if module else []
    return [".".join(parts[:i]) for i in range(len(parts) - 1, -1, -1)]


EXPLAIN: dict[Phase, str] = {
    "state": "the parameters or buffers already differed as the step started: the difference comes from an "
             "earlier step (bisect that one)",
    "loss": "every module output matched but the loss differs: the loss computed outside the model's modules",
    "grad": "every module's backward matched but a parameter gradient differs: the gradient all-reduce "
            "(DDP's reduction) or gradient accumulation",
    "update": "every module and gradient matched but a parameter differs after the optimizer step: the optimizer "
              "step, or a fault injected after it",
}


def diagnose(entries: list[tuple[str, list[int], str]], differing: dict[int, list[int]]) -> dict[str, Any]:
    """What the differing entries of a probe step say: the first difference in execution order, the first
    divergent module call (introduced: its inputs matched; carried: they did not), and the module tree.

    `entries`: the runs' common entry list (name, shape, dtype); `differing`: rank -> differing indices."""
    parsed = [parse(name) for name, _, _ in entries]
    bad = sorted({i for indices in differing.values() for i in indices})
    ranks_of = {i: [r for r, idx in sorted(differing.items()) if i in set(idx)] for i in bad}
    first = _describe(parsed, bad[0], ranks_of[bad[0]], entries) if bad else None
    calls = [i for i in bad if parsed[i].phase in ("forward", "backward")]
    module = _first_module(parsed, calls[0], ranks_of, entries, bad) if calls else None
    state = [shown(parsed[i].name) for i in bad if parsed[i].phase == "state"]
    tree = module_tree(entries, parsed, set(bad), module)
    return {"first": first, "first_module": module, "state_differs": state, "tree": tree,
            "entries": len(entries), "entries_differing": len(bad),
            "summary": summary(first, module, state)}


def _describe(parsed: list[Entry], i: int, ranks: list[int], entries: list[tuple[str, list[int], str]]
              ) -> dict[str, Any]:
    e = parsed[i]
    return {"entry": entries[i][0], "index": i, "phase": e.phase, "name": e.name, "call": e.call, "slot": e.slot,
            "shape": entries[i][1], "dtype": entries[i][2], "ranks": ranks,
            "explanation": EXPLAIN.get(e.phase)}


def _first_module(parsed: list[Entry], i: int, ranks_of: dict[int, list[int]],
                  entries: list[tuple[str, list[int], str]], bad: list[int]) -> dict[str, Any]:
    """The first module call with a differing entry; its inputs and outputs, on the ranks where it differs."""
    e = parsed[i]
    same_call = [j for j, p in enumerate(parsed) if (p.phase, p.name, p.call) == (e.phase, e.name, e.call)]
    differs = set(bad)
    inputs = [parsed[j].slot for j in same_call if parsed[j].is_input and j in differs]
    outputs = [parsed[j].slot for j in same_call if not parsed[j].is_input and j in differs]
    ranks = sorted({r for j in same_call if j in differs for r in ranks_of[j]})
    own_state = next((j for j, p in enumerate(parsed) if p.phase == "state" and p.name == e.name), None)
    earlier = [j for j in bad if j < same_call[0]]
    result: dict[str, Any] = {
        "module": e.name, "shown": shown(e.name), "type": entries[own_state][2] if own_state is not None else None,
        "phase": e.phase, "call": e.call, "entry": entries[i][0], "ranks": ranks,
        "differing_inputs": inputs, "differing_outputs": outputs, "inputs_matched": not inputs,
        "verdict": "introduced" if not inputs else "carried",
        "own_state_differs": own_state is not None and own_state in differs,
    }
    if inputs and not [j for j in earlier if parsed[j].phase in ("forward", "backward", "loss")]:
        # Its inputs differ though no module call before it produced a difference: the difference arose in code
        # that runs outside any module call, in the forward (or backward) of a module enclosing this call.
        result["arose_in"] = [shown(m) for m in _ancestors(e.name)]
    return result


def module_tree(entries: list[tuple[str, list[int], str]], parsed: list[Entry], bad: set[int],
                first: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every module (the `state` entries, in named_modules order: parents before children) with its depth,
    class, calls, status (equal / differs / first difference / not called) and whether its own state differs."""
    calls: dict[str, set[tuple[str, int | None]]] = {}
    differing: dict[str, list[str]] = {}
    verdict: dict[str, str] = {}  # from each module's first differing call: were its inputs equal?
    bad_calls: dict[tuple[str, str, int | None], bool] = {}  # (module, phase, call) -> an input differs
    for i, e in enumerate(parsed):
        if e.phase in ("forward", "backward"):
            calls.setdefault(e.name, set()).add((e.phase, e.call))
            if i in bad:
                differing.setdefault(e.name, []).append(entries[i][0].partition(":")[0] + f"#{e.call}:{e.slot}")
                key = (e.name, e.phase, e.call)
                bad_calls[key] = bad_calls.get(key, False) or e.is_input
    for (name, _phase, _call), input_differs in bad_calls.items():  # in execution order: the first call wins
        verdict.setdefault(name, "carried" if input_differs else "introduced")
    rows = []
    for i, e in enumerate(parsed):
        if e.phase != "state":
            continue
        name = e.name
        n = len(calls.get(name, ()))
        status = (FIRST if first is not None and first["module"] == name else DIFFERS if name in differing
                  else EQUAL if n else NOT_CALLED)
        rows.append({"module": name, "shown": shown(name), "depth": name.count(".") + 1 if name else 0,
                     "type": entries[i][2], "calls": n, "status": status, "state_differs": i in bad,
                     "verdict": verdict.get(name),
                     "differing": differing.get(name, [])[:8]})
    return rows


def summary(first: dict[str, Any] | None, module: dict[str, Any] | None, state: list[str]) -> str:
    """The diagnosis in a sentence or two, as the page, the CLI and the API give it."""
    if first is None:
        return "no entry differs: the replayed step is identical in both runs"
    parts = []
    if module is not None:
        where = f"{module['phase']} call #{module['call']} of {module['shown']}"
        if module["type"]:
            where += f" ({module['type']})"
        ranks = ", ".join(map(str, module["ranks"]))
        if module["inputs_matched"]:
            why = " (its own parameters already differed)" if module["own_state_differs"] else ""
            parts.append(f"first divergent module: {where} on rank {ranks}; its inputs matched, so it introduced "
                         f"the difference{why} (outputs differing: {', '.join(module['differing_outputs'])})")
        else:
            text = (f"first divergent module: {where} on rank {ranks}; its inputs already differed "
                    f"({', '.join(module['differing_inputs'])}), so it carried the difference")
            if module.get("arose_in"):
                text += (f"; no module call before it differs, so it arose in code outside module calls, in "
                         f"{module['arose_in'][0]}'s own {module['phase']}")
            parts.append(text)
    if first["phase"] != "forward" and first["phase"] != "backward":
        parts.insert(0, f"first difference: {first['entry']} on rank {', '.join(map(str, first['ranks']))}: "
                        f"{first['explanation']}")
    elif module is None:
        parts.append(f"first difference: {first['entry']}")
    if state and first["phase"] != "state":
        parts.append(f"state differing at the start: {', '.join(state[:5])}")
    return "; ".join(parts)


MARKS = {EQUAL: " ", DIFFERS: "~", FIRST: ">", NOT_CALLED: "-"}


def tree_lines(tree: list[dict[str, Any]]) -> list[str]:
    """The module tree as indented text (the CLI's): `>` first difference, `~` differs, `-` not called."""
    lines = []
    for row in tree:
        extra = [row["verdict"]] if row.get("verdict") else []
        extra += ["parameters differed at start"] if row["state_differs"] else []
        extra += [", ".join(row["differing"])] if row["differing"] else []
        lines.append(f"{MARKS[row['status']]} {'  ' * row['depth']}{row['shown']} ({row['type']}): {row['status']}"
                     + (f" [{'; '.join(extra)}]" if extra else ""))
    return lines
