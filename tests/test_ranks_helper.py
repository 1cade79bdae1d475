"""tests/ranks.py: a torchrun launch stuck past its limit fails with every rank's Python stack and leaves no
rank running (torchrun starts each rank in a session of its own)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ranks import finish_ranks, launcher, running, start_ranks
from tests.waiting import wait_until

STUCK = """
import os, sys, time
open(os.path.join(sys.argv[1], os.environ["RANK"]), "w").close()
time.sleep(600)
"""


def test_a_stuck_launch_shows_every_ranks_stack_and_leaves_none_running(tmp_path: Path) -> None:
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    proc = start_ranks([*launcher(2), str(script), str(tmp_path)], merge_output=True)
    wait_until(lambda: (tmp_path / "0").exists() and (tmp_path / "1").exists(), timeout=120,
               what="both ranks started")
    ranks = [int(p.name) for p in Path("/proc").glob("[0-9]*")
             if str(script) in (line := _cmdline(p)) and "torchrun" not in line]
    assert len(ranks) == 2
    with pytest.raises(AssertionError, match="ran past 0.5 s; every process under it was aborted") as failed:
        finish_ranks(proc, limit_s=0.5)
    # One process at a time: torchrun's stack and each rank's, whole (faulthandler writes a line in pieces).
    assert str(failed.value).count("Fatal Python error: Aborted") == 3, str(failed.value)
    assert str(failed.value).count('stuck.py", line 4 in <module>') == 2, str(failed.value)
    assert not [pid for pid in ranks if running(pid)]


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
