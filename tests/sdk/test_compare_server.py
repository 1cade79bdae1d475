"""One comparison: `detlab compare` of the same recordings offline (two directories) and through a real detlab API
process (two run ids, after `detlab upload`) gives the same verdict, for every verdict kind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, free_port
from tests.e2e.conftest import Stack, stack_env
from tests.sdk.test_online import wait_live

SCRIPT = Path(__file__).resolve().parent / "scripts" / "train.py"
# name -> the script's arguments (and the element it moves by one ulp)
RECORDINGS: dict[str, tuple[list[str], str | None]] = {
    "a": (["--steps", "10"], None),
    "same": (["--steps", "10"], None),
    "flipped": (["--steps", "10"], "3:0:3.bias"),
    "short": (["--steps", "5"], None),
    "weights": (["--steps", "10", "--names", "*.weight"], None),
    "no-op": (["--steps", "10"], None),
}
# name -> what its process's environment adds: a setting the preflight table knows (no NCCL release reads it)
EXTRA_ENV = {"no-op": {"NCCL_DETERMINISTIC": "1"}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, dict[str, Path], dict[str, int]]]:
    """A live API holding every recording of RECORDINGS, uploaded from its directory: (stack, dirs, run ids)."""
    tmp = tmp_path_factory.mktemp("server")
    port = free_port()
    env = stack_env(tmp, port, DETLAB_DATABASE_URL=f"sqlite:///{tmp / 'detlab.sqlite3'}")
    server = Stack(url=f"http://127.0.0.1:{port}", env=env, log_dir=tmp)
    subprocess.run([sys.executable, "-m", "detlab.cli", "migrate"], env=env, cwd=ROOT, check=True)
    server.start("api", "api", "--host", "127.0.0.1", "--port", str(port))
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    try:
        wait_live(server)
        dirs, ids = {}, {}
        for name, (args, flip) in RECORDINGS.items():
            dirs[name] = tmp / name
            subprocess.run([sys.executable, str(SCRIPT), str(dirs[name]), *args], check=True, timeout=300,
                           env={**clean, **({"DETLAB_TEST_FLIP": flip} if flip else {}), **EXTRA_ENV.get(name, {})})
            done = subprocess.run([sys.executable, "-m", "detlab.cli", "upload", str(dirs[name])],
                                  env={**clean, "DETLAB_SERVER": server.url,
                                       "DETLAB_TOKEN": env["DETLAB_INGEST_TOKEN"]},
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            ids[name] = int(re.search(r"to run (\d+) ", done.stdout).group(1))  # type: ignore[union-attr]
        yield server, dirs, ids
    finally:
        server.stop()


def compare(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    done = subprocess.run([sys.executable, "-m", "detlab.cli", "compare", *args, "--json"], capture_output=True,
                          text=True, timeout=120, env=env)
    return done.returncode, json.loads(done.stdout)


@pytest.mark.parametrize(("b", "verdict", "code"), [("same", "identical", 0), ("flipped", "diverged", 1),
                                                    ("short", "incomplete", 2), ("weights", "incomparable", 2)])
def test_server_and_offline_give_one_verdict(stack: tuple[Stack, dict[str, Path], dict[str, int]], b: str,
                                             verdict: str, code: int) -> None:
    server, dirs, ids = stack
    offline = compare(str(dirs["a"]), str(dirs[b]))
    online = compare(str(ids["a"]), str(ids[b]), "--server", server.url,
                     env={**os.environ, "DETLAB_TOKEN": server.env["DETLAB_INGEST_TOKEN"]})
    assert (offline[0], offline[1]["verdict"]) == (code, verdict)
    assert (online[0], online[1]["verdict"]) == (code, verdict)
    keys = ("first_divergent_step", "first_divergent_tensors", "ranks", "steps_differing", "steps_compared")
    assert {k: online[1][k] for k in keys} == {k: offline[1][k] for k in keys}
    # the same missing data, each side naming the runs by its own ids (offline: 1 and 2)
    renamed = [m.replace(f"run {ids[b]} ", "run 2 ").replace(f"run {ids['a']} ", "run 1 ")
               for m in online[1]["missing"]]
    assert renamed == offline[1]["missing"]
    if verdict == "incomplete":
        assert offline[1]["missing"] == ["run 2 lacks 5 of 10 steps (5-9)"]


def test_server_and_offline_print_the_preflight_findings_each_run_recorded(
        stack: tuple[Stack, dict[str, Path], dict[str, int]]) -> None:
    server, dirs, ids = stack
    env = {**os.environ, "DETLAB_TOKEN": server.env["DETLAB_INGEST_TOKEN"]}
    offline = compare(str(dirs["a"]), str(dirs["no-op"]))
    online = compare(str(ids["a"]), str(ids["no-op"]), "--server", server.url, env=env)
    assert offline[0] == online[0] == 0  # a variable nothing reads changes no bit
    assert offline[1]["preflight"] == online[1]["preflight"]
    assert [(f["run"], f["ranks"], f["rule"], f["matched"]) for f in offline[1]["preflight"]] == [
        ("b", [0], "nccl-no-op-variable", "NCCL_DETERMINISTIC=1")]
    texts = [subprocess.run([sys.executable, "-m", "detlab.cli", "compare", *args], capture_output=True, text=True,
                            timeout=120, env=env).stdout.splitlines()
             for args in ([str(dirs["a"]), str(dirs["no-op"])],
                          [str(ids["a"]), str(ids["no-op"]), "--server", server.url])]
    line = "  preflight, run B (rank 0): NCCL_DETERMINISTIC=1 — no NCCL release reads this variable"
    assert texts[0] == texts[1] and any(t.startswith(line) for t in texts[0]), texts
