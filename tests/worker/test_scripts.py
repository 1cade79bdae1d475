"""Registered scripts (`detlab worker --scripts FILE`): the file's checks, and a script's ranks launched as a
worker launches them, recording through detlab.Recorder into the worker's spool (gloo, two ranks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from detlab.core.configs import TorchFlags
from detlab.core.wire import AuditOpRecord, DiagnosisSpec, RankSpec, RunSpec, StepRecord, TensorsRecord
from detlab.worker.diagnose.cli import audit_result, invariance_result
from detlab.worker.launch import launch_ranks
from detlab.worker.runner import child_env, script_env
from detlab.worker.scripts import ScriptsError, load
from tests.sdk.test_docs import examples

SCRIPT = Path(__file__).resolve().parents[1] / "sdk" / "scripts" / "train.py"



def scripts_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "scripts.toml"
    path.write_text(body)
    return path


def test_a_scripts_file_describes_each_script_to_the_server(tmp_path: Path) -> None:
    found = load(scripts_file(tmp_path, f"""
[[script]]
name = "sft"
description = "our SFT recipe"
command = ["python", "train.py", "--steps", "50"]
workdir = "{tmp_path}"
world_sizes = [1, 2, 4]
steps = 50
global_batch = 32
"""))
    info = found["sft"].info()
    assert (info.name, info.script, info.world_sizes, info.default_steps, info.global_batch) == \
        ("sft", True, (1, 2, 4), 50, 32)
    assert found["sft"].command == ("python", "train.py", "--steps", "50")


@pytest.mark.parametrize(("body", "fragment"), [
    ('[[script]]\nname = "a"\ncommand = "python train.py; rm -rf /"', "command"),  # a shell string
    ('[[script]]\nname = "a"\ncommand = []', "command"),
    ('[[script]]\nname = "mlp"\ncommand = ["x"]', "'mlp' is taken"),  # a built-in
    ('[[script]]\nname = "a"\ncommand = ["x"]\n[[script]]\nname = "a"\ncommand = ["y"]', "'a' is taken"),
    ('[[script]]\nname = "a b"\ncommand = ["x"]', "name"),
    ('[[script]]\nname = "a"\ncommand = ["x"]\nworld_sizes = [0]', "world_sizes"),
    ('[[script]]\nname = "a"\ncommand = ["x"]\nworkdir = "/no/such/dir"', "is not a directory"),
    ('[[script]]\nname = "a"\ncommand = ["x"]\nshell = true', "shell"),
    ('[script]\nname = "a"', "[[script]]"),
    ("not toml [", "TOML"),
])
def test_a_bad_scripts_file_is_refused_naming_what_and_where(tmp_path: Path, body: str, fragment: str) -> None:
    with pytest.raises(ScriptsError, match="scripts.toml") as caught:
        load(scripts_file(tmp_path, body))
    assert fragment in str(caught.value)


def test_detlab_worker_refuses_a_bad_scripts_file_in_one_line(tmp_path: Path) -> None:
    path = scripts_file(tmp_path, '[[script]]\nname = "a"\ncommand = "bash -c x"')
    done = subprocess.run([sys.executable, "-m", "detlab.cli", "worker", "--scripts", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "command" in done.stderr


def test_a_scripts_ranks_record_into_the_workers_spool_under_the_configs_flags(tmp_path: Path) -> None:
    spec = RunSpec(run_id=1, attempt=1, workload="sdk-train", kind="train", world_size=2, steps=3,
                   fingerprint_interval=1, env={"NCCL_ALGO": "Ring"}, torch=TorchFlags(deterministic_algorithms=True))
    folder = tmp_path / "run"
    folder.mkdir()
    got: list = []

    def env(rank: int) -> dict[str, str]:
        base = {k: v for k, v in child_env(spec, rank, folder).items() if not k.startswith("DETLAB_")}
        return {**base, **script_env(spec, folder)}

    launch_ranks(RankSpec.for_run(spec, device="cpu"), folder, env=env, on_records=got.extend, timeout_s=300,
                 argv=[sys.executable, str(SCRIPT), str(tmp_path / "ignored"), "--steps", "3"], cwd=tmp_path)
    steps = sorted((r.step, r.rank) for r in got if isinstance(r, StepRecord))
    assert steps == [(s, r) for s in range(3) for r in range(2)]
    assert sum(isinstance(r, TensorsRecord) for r in got) == 2
    envs = [r for r in got if r.type == "env"]
    assert {e.effective_env.get("NCCL_ALGO") for e in envs} == {"Ring"}  # the config's env, in the ranks
    assert all(e.torch_flags and e.torch_flags.deterministic_algorithms for e in envs)  # its flags, applied
    assert not (tmp_path / "ignored").exists()  # out= gave way to the worker's folder
    assert os.environ.get("DETLAB_RUN_DIR") is None  # the worker's own environment is untouched


def run_docs_example(spec: RunSpec, name: str, tmp_path: Path) -> list:
    """Run docs/sdk.md's example `name`, as written, as a worker runs a registered script for `spec`; its records."""
    folder = tmp_path / "run"
    folder.mkdir()
    got: list = []

    def env(rank: int) -> dict[str, str]:
        base = {k: v for k, v in child_env(spec, rank, folder).items() if not k.startswith("DETLAB_")}
        return {**base, **script_env(spec, folder)}

    (tmp_path / name).write_text(examples()[name])
    launch_ranks(RankSpec.for_run(spec, device="cpu"), folder, env=env, on_records=got.extend, timeout_s=300,
                 argv=[sys.executable, name], cwd=tmp_path)
    return got


def test_a_scripts_op_audit_records_its_step_s_ops_into_the_workers_spool_under_the_job_s_settings(
        tmp_path: Path) -> None:
    spec = RunSpec(run_id=2, attempt=1, workload="sdk-audit", kind="op-audit", world_size=1, steps=1,
                   diagnosis=DiagnosisSpec(reruns=3, calls_per_op=1), torch=TorchFlags(deterministic_algorithms=True))
    got = run_docs_example(spec, "audit_step.py", tmp_path)
    ops = [r for r in got if isinstance(r, AuditOpRecord)]
    assert {"aten.addmm", "aten.bernoulli_"} <= {r.op for r in ops}
    assert all(r.nondeterministic is not True for r in ops)  # dropout's draw is the same draw on re-run
    assert all(r.reruns in (0, 3) for r in ops) and any(r.reruns == 3 for r in ops)  # the job's re-runs
    result = audit_result(got, RankSpec.for_run(spec, device="cpu"))
    assert result["torch_flags"]["deterministic_algorithms"] is True  # the job's config, in effect
    assert result["workload"] == "sdk-audit" and result["ops"]


def test_a_scripts_batch_invariance_records_the_job_s_cells_and_its_model_into_the_workers_spool(
        tmp_path: Path) -> None:
    spec = RunSpec(run_id=3, attempt=1, workload="sdk-invariance", kind="batch-invariance", world_size=1, steps=4,
                   diagnosis=DiagnosisSpec(ops=["sum"], dtypes=["float32"], batch_sizes=[1, 2], features=16,
                                           workload="sdk-invariance"))
    got = run_docs_example(spec, "invariance.py", tmp_path)
    result = invariance_result(got)
    assert [(r["op"], r["batch_size"]) for r in result["results"]] == [("sum", 1), ("sum", 2)]  # the job's cells
    assert result["model"] == {"workload": "sdk-invariance", "batch_sizes": [1, 2], "invariant": False,
                               "first_module": "1", "first_break": 2}  # the job's sizes, not the script's


class Sink:
    """Where the runner sends what a run's ranks recorded (the ingest API's part of IngestClient)."""

    def __init__(self) -> None:
        self.sent: list = []

    def records(self, run_id: int, attempt: int, records: list) -> None:
        self.sent.extend(records)

    def comm_log(self, *args: object) -> None:
        return None


def test_a_script_that_never_hands_over_its_step_fails_the_op_audit_saying_which_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from detlab.core.settings import get_settings
    from detlab.worker.runner import _launch_and_stream

    (tmp_path / "plain.py").write_text("print('trained, audited nothing')\n")
    path = scripts_file(tmp_path, f'[[script]]\nname = "plain"\ncommand = ["{sys.executable}", "plain.py"]\n'
                                  f'workdir = "{tmp_path}"\n')
    monkeypatch.setenv("DETLAB_SCRIPTS", str(path))
    get_settings.cache_clear()
    sink = Sink()
    spec = RunSpec(run_id=4, attempt=1, workload="plain", kind="op-audit", world_size=1, steps=1,
                   diagnosis=DiagnosisSpec(reruns=2))
    try:
        status, error = _launch_and_stream(spec, sink, "cpu", 300.0, None)  # type: ignore[arg-type]
    finally:
        get_settings.cache_clear()
    assert status == "failed" and error is not None
    assert error.startswith("plain never called detlab.audit(step)") and sink.sent == []
