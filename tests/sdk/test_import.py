"""`import detlab` stays light; `detlab.Recorder` loads the SDK, and torch only when one is made."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = """
import json, sys
import detlab
light = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numpy", "pydantic"))
Recorder = detlab.Recorder
before = "torch" in sys.modules
import torch
with Recorder(out=sys.argv[1]) as rec:
    rec.step(0, torch.nn.Linear(2, 2))
print(json.dumps({"light": light, "torch_before_construction": before}))
"""


def test_import_detlab_loads_no_torch_and_the_recorder_works_after_it(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "a")], capture_output=True, text=True,
                          cwd="/", timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"light": [], "torch_before_construction": False}
    assert [json.loads(line)["type"] for line in (tmp_path / "a" / "rank0.jsonl").read_text().splitlines()] == [
        "env", "tensors", "step"]
