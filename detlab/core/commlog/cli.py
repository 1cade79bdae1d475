"""`detlab parse-log FILE... [--json]`: print what each NCCL/RCCL log says."""

from __future__ import annotations

import json
import sys
from typing import Any

from .parser import parse


def summary(path: str, facts: dict[str, Any]) -> str:
    """A short human summary of one parsed log."""
    if facts["library"] is None:
        return f"{path}: no NCCL/RCCL debug output found"
    parts = [f"{facts['library']} {facts['version'] or '(version unknown)'}"]
    if facts["nranks"]:
        parts.append(f"{facts['nranks']} ranks" + (f" on {facts['nnodes']} nodes" if facts["nnodes"] else ""))
    if facts["nchannels"]:
        parts.append(f"{facts['nchannels']} channels")
    if facts["network"]:
        parts.append(f"network {facts['network']}")
    if facts["transports"]:
        parts.append("transports " + ", ".join(facts["transports"]))
    if facts["env"]:
        parts.append(f"{len(facts['env'])} env settings")
    if facts["choices"]:
        parts.append(f"{len(facts['choices'])} algo/proto choices")
    if facts["warnings"]:
        parts.append(f"{len(facts['warnings'])} warnings")
    parts.append("init complete" if facts["init_complete"] else "init not seen complete")
    lines = [f"{path}: " + "; ".join(parts)]
    lines += [f"  WARN {w}" for w in facts["warnings"][:5]]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Parse each file; print JSON objects (--json) or summaries. Exit 2 if a file was unreadable."""
    as_json = "--json" in argv
    paths = [a for a in argv if a != "--json"]
    if not paths:
        print("usage: detlab parse-log FILE... [--json]", file=sys.stderr)
        return 2
    rc = 0
    for path in paths:
        try:
            with open(path, "rb") as fh:
                text = fh.read().decode("utf-8", errors="replace")
        except OSError as exc:
            print(f"{path}: cannot read ({exc.strerror or exc}); check the path and permissions", file=sys.stderr)
            rc = 2
            continue
        facts = parse(text)
        if as_json:
            print(json.dumps({"file": path, **facts}, sort_keys=True))
        else:
            print(summary(path, facts))
    return rc
