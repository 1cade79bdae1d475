"""The command line as a user meets it when something outside it is wrong."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import free_port


@pytest.mark.parametrize("args", [["submit", "--workload", "mlp", "--config", "default"], ["cancel", "1"]])
def test_a_server_that_is_down_is_one_line_and_exit_2(args: list[str]) -> None:
    server = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    out = subprocess.run([sys.executable, "-m", "detlab.cli", *args, "--server", server],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"error: cannot reach {server}: [Errno 111] Connection refused"]
