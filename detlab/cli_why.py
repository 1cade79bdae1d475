"""`detlab why JOB`: a train job's why-report from a detlab server (GET /api/v1/jobs/{id}/why), as text with
✓/✗/? per item or as its JSON. The command itself is declared in detlab.cli."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

MARKS = {"pass": "✓", "fail": "✗", "not-checked": "?", "not-applicable": "-"}
WORDS = {"pass": "pass", "fail": "fail", "not-checked": "not checked", "not-applicable": "not applicable"}
INT32 = 2**31 - 1


def parse_pair(value: str | None) -> tuple[int, int] | None:
    """`--pair 3,4` → (3, 4): two run ids of the job. ValueError says what is wrong."""
    if value is None:
        return None
    parts = [p.strip() for p in value.split(",")]
    if len(parts) != 2 or not all(p.isdigit() and 1 <= int(p) <= INT32 for p in parts):
        raise ValueError(f"--pair {value!r}: give two run ids of the job, as I,J (e.g. --pair 3,4)")
    if parts[0] == parts[1]:
        raise ValueError(f"--pair {value!r}: the two runs are the same run")
    return int(parts[0]), int(parts[1])


def fetch(server: str, job: int, pair: tuple[int, int] | None, headers: dict[str, str],
          detail: Callable[[httpx.Response], str]) -> dict[str, Any]:
    """The job's why-report; ValueError with one line when the server cannot be reached or refuses."""
    params = {"a": pair[0], "b": pair[1]} if pair else {}
    try:
        resp = httpx.get(f"{server}/api/v1/jobs/{job}/why", params=params, headers=headers, timeout=120)
    except httpx.TransportError as exc:
        raise ValueError(f"cannot reach {server}: {exc}") from exc
    if resp.status_code != 200:
        raise ValueError(f"{server} answered {resp.status_code}: {detail(resp)}")
    report: dict[str, Any] = resp.json()
    return report


def text(report: dict[str, Any], server: str) -> list[str]:
    """The report as lines: a head naming the pair and its verdict, then per item its mark, title, what was
    found and its evidence as full addresses."""
    verdict = report.get("verdict") or "no verdict yet"
    if verdict == "diverged" and report.get("first_divergent_step") is not None:
        verdict = f"diverged at step {report['first_divergent_step']}"
    job = f"job {report['job_id']}: " if report.get("job_id") is not None else ""
    lines = [f"why {job}run {report['run_a']} (A) vs run {report['run_b']} (B), {verdict}"]
    if report.get("note"):
        lines.append(f"  note: {report['note']}")
    for item in report["items"]:
        lines.append(f"{item['step']}. {MARKS.get(item['status'], '?')} {item['title']} "
                     f"[{WORDS.get(item['status'], item['status'])}]")
        lines.append(f"     {item['found']}")
        lines += [f"     evidence: {link['text']}: {server}{link['href']}" for link in item["evidence"]]
    return lines
