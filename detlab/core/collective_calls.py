"""The collective calls of two training runs, lined up: the first call whose output differs, and why.

Each rank records, per step, every collective call in order (`seq`) with digests of its input and output
(detlab.tensors.collectives). Two runs are compared call by call at the same (step, seq) on the same comparison
slot (the same rank, or the same logical position: detlab.core.positions). At the first call whose output
differs: if its input matched on every slot, the difference was made by the collective itself ("inputs matched
→ reduction order/topology"), and the NCCL algorithm, protocol and channels the runs' logs show for that message
size are attached; if an input differed on some rank, it was carried in from earlier compute (those ranks are
named). Where some rank of the call was not recorded by both runs, its input is not known and neither is said.
Pure functions over plain data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DIGEST_BYTES = 16
REDUCTION_ORDER = "inputs matched → reduction order/topology"
CARRIED = "inputs differed → carried from earlier compute"
CALLS_DIFFER = "the runs made different calls here (op, dtype, element count or group size)"
# torch dtype name -> bytes per element, for the message size NCCL's TUNING lines print.
ELEMENT_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4, "int16": 2,
                 "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "complex64": 8}
# The torch functions (and DDP's bucket hook) -> the NCCL collective that carries them.
NCCL_OPS = {"all_reduce": "AllReduce", "ddp_allreduce": "AllReduce", "broadcast": "Broadcast",
            "all_gather_into_tensor": "AllGather", "all_gather": "AllGather",
            "reduce_scatter_tensor": "ReduceScatter", "reduce_scatter": "ReduceScatter",
            "all_gather_single": "AllGather", "reduce_scatter_single": "ReduceScatter"}
GATHER_SCATTER = {"AllGather", "ReduceScatter"}


@dataclass(slots=True)
class StepCalls:
    """One rank's calls in one step: (op, dtype, count, group_size) per call, packed digests, unread outputs."""

    calls: list[tuple[str, str, int, int]]
    inputs: bytes
    outputs: bytes
    unread: frozenset[int] = field(default_factory=frozenset)

    def digest(self, packed: bytes, seq: int) -> bytes:
        return packed[seq * DIGEST_BYTES:(seq + 1) * DIGEST_BYTES]


RunCalls = dict[tuple[int, int], StepCalls]  # (step, rank) -> its calls


def message_bytes(op: str, dtype: str, count: int, group_size: int) -> list[int]:
    """The sizes NCCL may print for this call in its TUNING lines: the input's bytes, and for gathers and
    scatters also the whole and the per-rank buffer (NCCL versions count them differently). [] if unknown."""
    size = ELEMENT_BYTES.get(dtype)
    if size is None:
        return []
    nbytes = count * size
    if NCCL_OPS.get(op) in GATHER_SCATTER:
        return sorted({nbytes, nbytes * group_size, nbytes // max(group_size, 1)})
    return [nbytes]


def nccl_choices(logs: list[dict[str, Any]], op: str, sizes: list[int]) -> list[dict[str, Any]]:
    """What one run's parsed NCCL logs (detlab.core.commlog.parse, one per rank) say NCCL chose for this op at
    these sizes: algorithm, protocol, channels, how many lines said so. A TUNING line that names no op counts
    when its size matches."""
    name = NCCL_OPS.get(op)
    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    for parsed in logs:
        for choice in parsed.get("choices") or []:
            if choice["bytes"] not in sizes or (choice["op"] is not None and choice["op"] != name):
                continue
            channels = choice.get("channels")
            key = (choice["bytes"], choice["algo"], choice["proto"], tuple(channels or ()))
            row = found.setdefault(key, {"op": choice["op"] or name, "bytes": choice["bytes"], "algo": choice["algo"],
                                         "proto": choice["proto"], "channels": channels, "count": 0})
            row["count"] += choice.get("count", 1)
    return sorted(found.values(), key=lambda c: (c["bytes"], c["algo"], c["proto"]))


def _choices_text(choices: list[dict[str, Any]] | None) -> str:
    if choices is None:
        return "no NCCL log"
    if not choices:
        return "its NCCL logs show no choice for this size (TUNING lines need NCCL_DEBUG_SUBSYS=TUNING)"
    return ", ".join(f"{c['algo']}/{c['proto']}" + (f" channels {c['channels'][0]}..{c['channels'][1]}"
                                                      if c["channels"] else "") for c in choices)


def _first_on_slot(x: RunCalls, y: RunCalls, steps: list[int], slot: int) -> tuple[int, int] | None:
    """The first (step, seq) on one slot where the calls differ or an output read in both runs differs."""
    for step in steps:
        cx, cy = x.get((step, slot)), y.get((step, slot))
        if cx is None or cy is None:
            continue
        for seq in range(min(len(cx.calls), len(cy.calls))):
            if cx.calls[seq] != cy.calls[seq]:
                return step, seq
            if seq in cx.unread or seq in cy.unread:
                continue
            if cx.digest(cx.outputs, seq) != cy.digest(cy.outputs, seq):
                return step, seq
        if len(cx.calls) != len(cy.calls):
            return step, min(len(cx.calls), len(cy.calls))
    return None


def _hex(fp_version: str, digest: bytes) -> str:
    return f"{fp_version}:{digest.hex()}"


def first_difference(a: RunCalls, b: RunCalls, *, positions: dict[int, dict[str, int]] | None = None,
                     logs: tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None] = (None, None),
                     fp_version: str = "fp") -> dict[str, Any]:
    """The first collective call (step, seq) whose output differs between runs A and B, compared slot by slot
    (B's ranks already renumbered as A's where positions line them up), with the diagnosis: `cause` is
    `reduction-order` (its input matched on every rank of the call), `carried` (an input differed),
    `inputs-unknown` (the inputs compared matched, but some rank of the call was not recorded by both runs) or
    `calls-differ`.
    `logs`: each run's parsed NCCL logs (None: none recorded). `status`: identical | differs | not-recorded."""
    if not a or not b:
        lacking = [name for name, calls in (("A", a), ("B", b)) if not calls]
        return {"status": "not-recorded", "calls_compared": 0, "first": None,
                "text": f"collectives: run {' and '.join(lacking)} recorded no collective calls"}
    slots = sorted({r for _, r in a} & {r for _, r in b})
    steps = sorted({s for s, _ in a} & {s for s, _ in b})
    compared = sum(min(len(a[(s, r)].calls), len(b[(s, r)].calls))
                   for s in steps for r in slots if (s, r) in a and (s, r) in b)
    firsts = {slot: at for slot in slots if (at := _first_on_slot(a, b, steps, slot)) is not None}
    if not firsts:
        unread = sum(len(c.unread) for c in (*a.values(), *b.values()))
        alone = len(set(a) ^ set(b))
        skipped = [f"{unread} outputs never waited for"] if unread else []
        skipped += [f"{alone} (step, rank) call lists recorded by one run only"] if alone else []
        return {"status": "identical", "calls_compared": compared, "first": None,
                "text": f"collectives: {compared} calls compared on {len(slots)} rank(s), every output equal"
                        + (f" (not compared: {'; '.join(skipped)})" if skipped else "")}
    step, seq = min(firsts.values())
    here = [slot for slot in slots if (step, slot) in a and (step, slot) in b
            and seq < len(a[(step, slot)].calls) and seq < len(b[(step, slot)].calls)]
    # The call as run A made it (as run B did where A's stopped short of it: one run made more calls).
    made = [c.calls[seq] for c in (a.get((step, s)) for s in slots) if c is not None and seq < len(c.calls)]
    made += [c.calls[seq] for c in (b.get((step, s)) for s in slots) if c is not None and seq < len(c.calls)]
    call = made[0] if made else None
    differing = [slot for slot, at in firsts.items() if at == (step, seq)]
    if any(a[(step, s)].calls[seq] != b[(step, s)].calls[seq] for s in here) or not here:
        cause, said = "calls-differ", CALLS_DIFFER
        inputs_differ: list[int] = []
    else:
        inputs_differ = [s for s in here if (x := a[(step, s)]).digest(x.inputs, seq)
                         != (y := b[(step, s)]).digest(y.inputs, seq)]
        unknown = _not_compared(a, b, step, seq, here)
        if inputs_differ:
            cause, said = "carried", CARRIED
        elif unknown:
            cause, said = "inputs-unknown", (f"inputs equal on rank(s) {', '.join(map(str, here))}; {unknown} not "
                                             "recorded by both runs → cause not known")
        else:
            cause, said = "reduction-order", REDUCTION_ORDER
    first: dict[str, Any] = {"step": step, "seq": seq, "cause": cause, "diagnosis": said,
                             "ranks": differing, "input_ranks_differing": inputs_differ,
                             "positions": {str(s): positions[s] for s in differing if positions and s in positions}}
    if call is not None:
        op, dtype, count, group = call
        sizes = message_bytes(op, dtype, count, group)
        first.update(op=op, dtype=dtype, count=count, group_size=group, bytes=sizes[0] if sizes else None)
        slot = differing[0]
        if (step, slot) in a and (step, slot) in b and seq < len(a[(step, slot)].calls) and cause != "calls-differ":
            first["digests"] = {side: {"input": _hex(fp_version, c.digest(c.inputs, seq)),
                                       "output": _hex(fp_version, c.digest(c.outputs, seq))}
                                for side, c in (("a", a[(step, slot)]), ("b", b[(step, slot)]))}
        if cause == "reduction-order":
            first["nccl"] = {side: None if side_logs is None else nccl_choices(side_logs, op, sizes)
                             for side, side_logs in zip(("a", "b"), logs, strict=True)}
    return {"status": "differs", "calls_compared": compared, "first": first, "text": calls_text(first)}


def _not_compared(a: RunCalls, b: RunCalls, step: int, seq: int, here: list[int]) -> str:
    """The ranks of call (step, seq) whose inputs were not compared (recorded by one run only, or by neither:
    fewer ranks than the call's group), in words; "" when every rank's were."""
    made = {r for run in (a, b) for (s, r), c in run.items() if s == step and seq < len(c.calls)}
    alone = sorted(made - set(here))
    group = a[(step, here[0])].calls[seq][3]
    unseen = group - len(here) - len(alone)  # a subgroup call on more ranks than its group: none unseen
    parts = [f"rank(s) {', '.join(map(str, alone))}"] if alone else []
    parts += [f"{unseen} {'other ' if alone else ''}rank(s) of its group of {group}"] if unseen > 0 else []
    return " and ".join(parts)


def calls_text(first: dict[str, Any]) -> str:
    """The first differing collective in one line, as the page and `detlab compare` show it."""
    where = f"step {first['step']} call {first['seq']}"
    what = (f" {first['op']} {first['dtype']} x{first['count']} over {first['group_size']} ranks"
            if first.get("op") else "")
    ranks = f" on rank(s) {', '.join(map(str, first['ranks']))}" if first["ranks"] else ""
    line = f"first differing collective: {where}{what}{ranks}: {first['diagnosis']}"
    if first["cause"] == "carried":
        line += f" (inputs differed on rank(s) {', '.join(map(str, first['input_ranks_differing']))})"
    if "nccl" in first:
        size = f"{first['bytes']} bytes" if first.get("bytes") is not None else "this size"
        line += (f"; NCCL at {size}: run A {_choices_text(first['nccl']['a'])}; "
                 f"run B {_choices_text(first['nccl']['b'])}")
    return line


def compare(a: RunCalls, b: RunCalls, *, alignment: Any, world_sizes: tuple[int, int],
            positions: dict[int, dict[str, int]] | None = None,
            logs: tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None] = (None, None),
            fp_version: str = "fp") -> dict[str, Any]:
    """`first_difference` after lining B's ranks up with A's (`alignment`: detlab.core.positions.Alignment).
    Ranks that do not meet one to one (different world sizes without positions) are not compared."""
    if alignment.reason:
        return {"status": "incomparable", "calls_compared": 0, "first": None,
                "text": f"collectives: not compared: {alignment.reason}"}
    if alignment.b_to_a is not None:
        b = {(step, alignment.b_to_a[r]): c for (step, r), c in b.items() if r in alignment.b_to_a}
    elif world_sizes[0] != world_sizes[1] and a and b:
        return {"status": "incomparable", "calls_compared": 0, "first": None,
                "text": f"collectives: not compared: world sizes {world_sizes[0]} vs {world_sizes[1]}, so ranks "
                        "do not meet one to one (runs whose positions line up do)"}
    return first_difference(a, b, positions=positions, logs=logs, fp_version=fp_version)
