"""The command line as a user meets it when something outside it is wrong."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port


@pytest.mark.parametrize("args", [["submit", "--workload", "mlp", "--config", "default"], ["cancel", "1"],
                                  ["bisect", "1"], ["fix", "--workload", "scatter"]])
def test_a_server_that_is_down_is_one_line_and_exit_2(args: list[str]) -> None:
    server = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    out = subprocess.run([sys.executable, "-m", "detlab.cli", *args, "--server", server],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"error: cannot reach {server}: [Errno 111] Connection refused"]


# ---- users and tokens (auth mode local) -----------------------------------------------------------------

def detlab(*args: str, data_dir: Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DETLAB_")}
    return subprocess.run([sys.executable, "-m", "detlab.cli", *args, "--data-dir", str(data_dir)], input=stdin,
                          capture_output=True, text=True, timeout=120, env=env)


def test_user_add_and_token_create_use_the_data_dir_of_up(tmp_path: Path) -> None:
    out = detlab("user", "add", "ada", "--role", "member", "--password-stdin", data_dir=tmp_path,
                 stdin="correct horse battery\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "user ada added (member)"
    out = detlab("token", "create", "--user", "ada", "--scope", "submit", "--scope", "ingest", data_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip()
    assert token.startswith("detlab_") and len(token) > 40 and "shown once" in out.stderr
    with sqlite3.connect(tmp_path / "detlab.sqlite3") as db:
        (password_hash,) = db.execute("SELECT password_hash FROM users WHERE name = 'ada'").fetchone()
        rows = db.execute("SELECT token_hash, scopes FROM api_tokens").fetchall()
    assert password_hash.startswith("$argon2id$")
    assert rows == [(hashlib.sha256(token.encode()).hexdigest(), '["ingest", "submit"]')]
    listed = detlab("token", "list", data_dir=tmp_path)
    assert listed.stdout.startswith("1\tada\tingest,submit\t")
    assert detlab("token", "revoke", "1", data_dir=tmp_path).stdout.strip() == "token 1 of ada revoked"
    with sqlite3.connect(tmp_path / "detlab.sqlite3") as db:
        assert db.execute("SELECT count(*) FROM api_tokens").fetchone() == (0,)


@pytest.mark.parametrize("args, stdin, message", [
    (["user", "add", "bob", "--role", "root", "--password-stdin"], "long enough pw\n", "unknown role 'root'"),
    (["user", "add", "bob", "--password-stdin"], "short\n", "at least 8 characters"),
    (["token", "create", "--user", "nobody", "--scope", "read"], "", "no user 'nobody'"),
    (["token", "create", "--user", "vic", "--scope", "submit"], "", "is a viewer and cannot hold scope submit"),
    (["token", "create", "--user", "vic", "--scope", "write"], "", "unknown scope write"),
    (["user", "add", "vic", "--password-stdin"], "long enough pw\n", "user 'vic' exists"),
])
def test_user_and_token_errors_are_one_line_and_exit_2(tmp_path: Path, args: list[str], stdin: str,
                                                        message: str) -> None:
    assert detlab("user", "add", "vic", "--role", "viewer", "--password-stdin", data_dir=tmp_path,
                  stdin="long enough pw\n").returncode == 0
    out = detlab(*args, data_dir=tmp_path, stdin=stdin)
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("error: ") and message in line


def test_the_cli_sends_detlab_token(monkeypatch: pytest.MonkeyPatch) -> None:
    from detlab.cli.common import auth_headers as _auth_headers
    from detlab.core.settings import get_settings

    get_settings.cache_clear()
    monkeypatch.setenv("DETLAB_TOKEN", "detlab_abc")
    assert _auth_headers() == {"Authorization": "Bearer detlab_abc"}
    get_settings.cache_clear()
    monkeypatch.delenv("DETLAB_TOKEN")
    assert _auth_headers() == {}
    get_settings.cache_clear()


@pytest.mark.parametrize("host, allowed", [("detlab.internal", "detlab.internal"), ("0.0.0.0", None)])
def test_api_serves_the_bound_host_name_and_never_trusts_forwarded_addresses(
        monkeypatch: pytest.MonkeyPatch, host: str, allowed: str | None) -> None:
    import uvicorn
    from typer.testing import CliRunner

    from detlab.backend.guards import Guard
    from detlab.cli import app
    from detlab.core.settings import get_settings

    served: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn.Server, "run", lambda server, sockets=None: served.update(
        app=server.config.app, proxy_headers=server.config.proxy_headers))
    monkeypatch.setenv("DETLAB_AUTH_MODE", "proxy")
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(app, ["api", "--host", host])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    assert "X-Forwarded-User is trusted only from 127.0.0.1, ::1 (DETLAB_TRUSTED_PROXIES)" in result.output
    assert served["proxy_headers"] is False  # the peer address is the connection's, not X-Forwarded-For
    guard = next(m for m in served["app"].user_middleware if m.cls is Guard)
    hosts = guard.kwargs["settings"].allowed_hosts
    assert hosts == ["localhost", "127.0.0.1", "::1", *([allowed] if allowed else [])]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "detlab.cli", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_detlab_server_is_read_by_the_commands_that_talk_to_one() -> None:
    gone = f"http://127.0.0.1:{free_port()}"
    for args in (["submit", "--config", "default"], ["cancel", "1"], ["compare", "1", "2"]):
        done = run_cli(*args, env={"DETLAB_SERVER": gone})
        assert done.returncode == 2 and gone in done.stderr, (args, done.stderr)
        assert done.stderr.count("\n") == 1, done.stderr


def test_gates_need_wait() -> None:
    done = run_cli("submit", "--config", "default", "--check")
    assert (done.returncode, done.stderr) == (2, "error: --check and --max-cost judge the finished job: add --wait\n")


def row(index: int, name: str, interval: list[float] | None, text: str) -> dict[str, Any]:
    return {"config_index": index, "name": name, "samples_per_s": None, "spread": None, "step_time_ms_median": None,
            "runs": 1, "cost": None, "cost_interval": interval, "cost_text": text}


def repro(comparable: int, identical: int) -> dict[str, Any]:
    return {"config_index": 0, "name": "default", "repeats": 2, "recorded": 2, "rate": None,
            "comparable": comparable, "identical_to_first": identical}


PAIR = {"verdict": "identical", "reason": None, "config_diff": [], "reproducibility": [],
        "effective_mismatches": [], "throughput": [row(0, "default", None, "baseline"),
                                                   row(1, "deterministic", [0.12, 0.18], "15.0% slower (...)")]}
SINGLE = {**PAIR, "verdict": None, "throughput": []}
CELLS = {"world_size": 2, "configs": [], "equality": [], "effective": [], "logs": [], "note": None, "export": {}}


@pytest.mark.parametrize(("result", "path", "check", "max_cost", "failures"), [
    (PAIR, "comparison", True, None, []),
    ({**PAIR, "verdict": "diverged", "reason": None}, "comparison", True, None, ["verdict diverged"]),
    ({**PAIR, "verdict": "incomplete", "reason": "run 2 lacks 3 steps"}, "comparison", True, None,
     ["verdict incomplete: run 2 lacks 3 steps"]),
    (PAIR, "comparison", False, 20.0, []),  # the interval reaches 18 %: under the limit
    (PAIR, "comparison", False, 15.0, []),  # the point is at the limit, the interval spans it: not proven above
    (PAIR, "comparison", False, 10.0, ["config 1 deterministic: 15.0% slower (...), above --max-cost 10%"]),
    ({**PAIR, "throughput": [PAIR["throughput"][0],
                             row(1, "deterministic", None, "15.0% slower (too few timed steps)")]},
     "comparison", False, 10.0, ["config 1 deterministic: cost 15.0% slower (too few timed steps); no interval to "
                                 "hold against --max-cost"]),
    ({**SINGLE, "reproducibility": [repro(2, 1)]}, "comparison", True, None,
     ["config 0 default: 1 of 2 comparable repeats identical to the first"]),
    ({**SINGLE, "reproducibility": [repro(0, 0)]}, "comparison", True, None,
     ["config 0 default: no comparable repeats"]),
    ({**CELLS, "cells": [{"reproducible": True}, {"reproducible": False}]}, "collective", True, None,
     ["1 of 2 cells not reproducible"]),
    ({**CELLS, "cells": []}, "collective", True, None, ["0 of 0 cells not reproducible"]),
    ({"kind": "op-audit", "workload": "mlp", "configs": []}, "diagnosis", True, None,
     ["verdict none: nothing was measured"]),
])
def test_submit_gates(result: dict[str, Any], path: str, check: bool, max_cost: float | None,
                      failures: list[str]) -> None:
    from detlab.cli import gate_failures, typed_result

    job = {"id": 7, "status": "succeeded", "verdict": None, "result_path": f"/api/v1/jobs/7/{path}"}
    typed = typed_result({"job": job, **result})
    assert gate_failures(typed, job, check=check, max_cost=max_cost) == failures


def test_every_command_help_lists_its_own_options() -> None:
    for command, option in (("submit", "--max-cost"), ("upload", "--server"), ("compare", "--server"),
                            ("verify-collective", "--max-bytes"), ("batch-invariance", "--batch-sizes"),
                            ("audit", "--reruns")):
        assert option in run_cli(command, "--help").stdout, command


@pytest.mark.parametrize(("args", "fragment"), [
    (["submit", "--config", "missing.json"], "--config missing.json: cannot read it"),
    (["submit", "--config", "default", "--collective", "{x"], "--collective: not JSON"),
    (["upload", "nowhere"], "nowhere"),
    (["compare", "nowhere", "elsewhere"], "nowhere"),
])
def test_user_errors_are_one_line_and_exit_2(tmp_path: Path, args: list[str], fragment: str) -> None:
    done = subprocess.run([sys.executable, "-m", "detlab.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, "DETLAB_TOKEN": "t" * 20})
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ") and fragment in done.stderr, done.stderr


def test_submit_sweeps_over_train_when_asked(tmp_path: Path) -> None:
    """`--kind sweep` sent `"over": "collective"` whatever was wanted; `--over train` sweeps the workload's
    training (its cells are train runs, counted in steps), and the default stays collective."""
    import httpx

    from tests.e2e.conftest import Stack, stack_env, wait_for

    def serving() -> bool:  # /health says 503 without a worker; the API itself answers
        try:
            return httpx.get(f"{stack.url}/api/v1/meta", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    port = free_port()
    stack = Stack(url=f"http://127.0.0.1:{port}", env=stack_env(tmp_path, port), log_dir=tmp_path)
    subprocess.run([sys.executable, "-m", "detlab.cli", "migrate"], env=stack.env, check=True, timeout=120)
    stack.start("api", "api", "--port", str(port))  # no worker: the jobs stay queued, as submitted
    try:
        wait_for("the API", serving, stack, timeout=60)
        jobs = []
        # A sweep over collectives takes no train keys (a 422 otherwise): the default sends none.
        for over in (["--over", "train", "--workload", "mlp", "--steps", "2"], []):
            done = subprocess.run([sys.executable, "-m", "detlab.cli", "submit", "--server", stack.url, "--kind",
                                   "sweep", *over, "--config", "default",
                                   "--knobs", '{"OMP_NUM_THREADS": ["1", "2"]}', "--json"], env=stack.env,
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr + stack.logs()
            jobs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    finally:
        stack.stop()
    assert [job["params"]["sweep"]["over"] for job in jobs] == ["train", "collective"]
    assert jobs[0]["workload"] == "mlp" and jobs[1]["workload"] == "collective"
