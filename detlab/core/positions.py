"""Ranks lined up by logical position (dp, tp, pp, cp ...) rather than by rank number.

Two runs of one model need not number their ranks alike: another launcher, another node order, another world
size. Where both runs recorded every rank's position (the SDK's `position=`/device mesh, the built-in DDP ranks'
dp = rank), rank r of run B is compared with the rank of run A at the same position. Pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass

Position = dict[str, int]


def text(position: Position) -> str:
    """`dp=1,tp=0` (dimensions in the order recorded)."""
    return ",".join(f"{dim}={i}" for dim, i in position.items())


def _key(position: Position) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(position.items()))


@dataclass(frozen=True)
class Alignment:
    """How run B's ranks meet run A's: `b_to_a` (B's rank -> A's rank at the same position; None: by rank number,
    as before), or why they cannot (`reason`: the runs are incomparable), and a note for the verdict."""

    b_to_a: dict[int, int] | None = None
    reason: str | None = None
    note: str | None = None


def _duplicate(run: int, positions: dict[int, Position]) -> str | None:
    seen: dict[tuple[tuple[str, int], ...], int] = {}
    for rank, position in sorted(positions.items()):
        other = seen.setdefault(_key(position), rank)
        if other != rank:
            return f"ranks {other} and {rank} of run {run} record the same position {text(position)}"
    return None


def _data_parallel_only(positions: dict[int, Position]) -> bool:
    return all(i == 0 for position in positions.values() for dim, i in position.items() if dim != "dp")


def line_up(runs: tuple[int, int], a: dict[int, Position], b: dict[int, Position],
            world_sizes: tuple[int, int]) -> Alignment:
    """Line run B's ranks up with run A's by position. Positions count only when both runs recorded one for
    each of their ranks (`a`, `b`: rank -> position); otherwise ranks meet by number, as before.

    Data-parallel-only runs (every other coordinate 0) at different world sizes keep the rank-consensus
    comparison (their replicas are compared as one); any other set of positions that differs is incomparable."""
    if not a or not b or len(a) != world_sizes[0] or len(b) != world_sizes[1]:
        return Alignment()
    for run, positions in zip(runs, (a, b), strict=True):
        if reason := _duplicate(run, positions):
            return Alignment(reason=f"positions do not line up: {reason}")
    dims_a, dims_b = ({d for p in side.values() for d in p} for side in (a, b))
    if dims_a != dims_b:
        return Alignment(reason=f"positions do not line up: run {runs[0]} records dimensions {sorted(dims_a)}, "
                                f"run {runs[1]} {sorted(dims_b)}")
    at_a = {_key(p): r for r, p in a.items()}
    at_b = {_key(p): r for r, p in b.items()}
    if at_a.keys() == at_b.keys():
        b_to_a = {rank_b: at_a[key] for key, rank_b in at_b.items()}
        moved = sorted(rb for rb, ra in b_to_a.items() if rb != ra)
        note = (f"ranks lined up by logical position ({', '.join(sorted(dims_a))}); rank numbers are run "
                f"{runs[0]}'s (run {runs[1]}'s ranks {moved[:8]} are numbered otherwise)") if moved else None
        return Alignment(b_to_a=b_to_a, note=note)
    if world_sizes[0] != world_sizes[1] and _data_parallel_only(a) and _data_parallel_only(b):
        return Alignment()  # DDP replicas at two world sizes: the rank-consensus comparison
    only_a = sorted(set(at_a) - set(at_b))
    only_b = sorted(set(at_b) - set(at_a))
    said = [f"run {run} alone has {', '.join(text(dict(k)) for k in keys[:4])}"
            + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")
            for run, keys in zip(runs, (only_a, only_b), strict=True) if keys]
    return Alignment(reason=f"positions do not line up: {'; '.join(said)}")
