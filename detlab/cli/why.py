"""`detlab why JOB`: a train job's why-report from a detlab server (GET /api/v1/jobs/{id}/why), as text with
✓/✗/? per item or as its JSON."""

from __future__ import annotations

import json
from typing import Annotated, Any

import httpx
import typer

from detlab.cli.common import DEFAULT_SERVER, Server, fail, token
from detlab.cli.root import app
from detlab.core import http

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


def fetch(server: str, job: int, pair: tuple[int, int] | None, api_token: str | None) -> dict[str, Any]:
    """The job's why-report; ValueError with one line when the server cannot be reached or refuses."""
    params = {"a": pair[0], "b": pair[1]} if pair else {}
    try:
        with http.connect(server, api_token, timeout_s=120) as client:
            resp = client.get(f"/api/v1/jobs/{job}/why", params=params)
    except httpx.TransportError as exc:
        raise ValueError(f"cannot reach {server}: {exc}") from exc
    if resp.status_code != 200:
        raise ValueError(f"{server} answered {resp.status_code}: {http.detail(resp)}")
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


@app.command()
def why(
    job: Annotated[int, typer.Argument(help="a train job's id")],
    pair: Annotated[str | None, typer.Option(help="two run ids of the job, I,J (default: the pair its verdict "
                                                  "is about)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the report's JSON")] = False,
    server: Server = DEFAULT_SERVER,
) -> None:
    """Why two runs of a train job may part: the checklist in the order to debug it (logs, env parity,
    nondeterministic ops, stack and topology, batch invariance, data order), ✓ pass, ✗ fail, ? not checked, - not
    applicable, each with its evidence. Exit 0 with the report, 2 on any error."""
    try:
        report = fetch(server.rstrip("/"), job, parse_pair(pair), token())
    except ValueError as exc:
        fail(str(exc))
    typer.echo(json.dumps(report) if as_json else "\n".join(text(report, server.rstrip("/"))))
