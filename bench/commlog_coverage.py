"""How much of what unseen NCCL/RCCL logs say the parser reads right: one figure, and every miss.

Each log under tests/fixtures/commlogs/unseen/ was written for this measure (formats taken from public
logs, listed in ../SOURCES.md) and is listed in expected.json with the facts a reader of the log finds in
it. A fact is right when `parse` gives it; coverage is right facts / all facts.

    python bench/commlog_coverage.py [--dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from detlab.core.commlog import parse  # noqa: E402

UNSEEN = ROOT / "tests" / "fixtures" / "commlogs" / "unseen"


def holds(fact: list[Any], parsed: dict[str, Any]) -> bool:
    """Whether one expected fact is in the parse result."""
    kind, args = fact[0], fact[1:]
    if kind in ("library", "version", "nranks", "nnodes", "nchannels", "network", "init_complete",
                "hip_version", "nvls_channels", "tuner"):
        return parsed.get(kind) == args[0]
    if kind == "transport":
        return args[0] in parsed["transports"]
    if kind == "env":
        return parsed["env"].get(args[0]) == args[1]
    if kind == "invalid":
        return any(n.get("var") == args[0] for n in parsed["invalid_env"])
    if kind == "warning":
        return args[0] in parsed["warnings"]
    if kind == "process":
        return args[0] in parsed["processes"]
    if kind == "rank":
        rank = next((r for r in parsed["ranks"] if r["rank"] == args[0]), None)
        return rank is not None and rank.get(args[1]) == args[2]
    if kind == "ring":
        return {"channel": args[0], "order": args[1]} in parsed["ring_orders"]
    if kind == "tree":
        channel, rank, parent, children = args
        return {"channel": channel, "rank": rank, "parent": parent, "children": children} in parsed["tree_orders"]
    if kind == "choice":
        return any((c["op"], c["bytes"], c["algo"], c["proto"]) == tuple(args) for c in parsed["choices"])
    if kind == "choice_count":
        return sum(c["count"] for c in parsed["choices"] if (c["op"], c["bytes"]) == tuple(args[:2])) == args[2]
    raise ValueError(f"unknown fact kind {kind!r}")


def score(directory: Path = UNSEEN) -> dict[str, Any]:
    """{"right", "total", "coverage", "misses": [[file, fact], ...]} over every listed log."""
    expected = json.loads((directory / "expected.json").read_text())
    right = total = 0
    misses: list[list[Any]] = []
    for name, facts in sorted(expected.items()):
        parsed = parse((directory / name).read_text(encoding="utf-8", errors="replace"))
        for fact in facts:
            total += 1
            if holds(fact, parsed):
                right += 1
            else:
                misses.append([name, fact])
    return {"right": right, "total": total, "coverage": right / total if total else 0.0, "misses": misses}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=UNSEEN)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = score(args.dir)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"commlog coverage on {args.dir.name}/: {result['right']}/{result['total']} facts = "
          f"{100 * result['coverage']:.1f} %")
    for name, fact in result["misses"]:
        print(f"  miss {name}: {fact}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
