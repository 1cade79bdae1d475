"""The worker's launch environment and spool reading (plain functions, no Celery)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from detlab.worker.runner import SpoolReader, rank_env


def spec(**env: str) -> dict:
    return {"env": env, "world_size": 4, "threads": None}


def test_rank_env_refuses_a_variable_outside_the_allow_list(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="LD_PRELOAD is not an allowed variable"):
        rank_env(spec(LD_PRELOAD="/tmp/x.so"), 0, 1234, tmp_path)


def test_rank_env_is_torchrun_style_with_one_nccl_log_per_rank(tmp_path: Path) -> None:
    env = rank_env(spec(NCCL_ALGO="Ring", NCCL_DEBUG_SUBSYS="INIT"), 2, 1234, tmp_path)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]) == ("2", "2", "4", "1234")
    assert env["NCCL_DEBUG_FILE"] == str(tmp_path / "nccl-rank2.log")
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_ALGO"] == "Ring"
    assert env["NCCL_DEBUG_SUBSYS"] == "INIT"  # the config wins over the worker's default


def test_spool_reader_waits_for_the_rest_of_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    whole = json.dumps({"type": "step", "step": 1}) + "\n"
    path.write_text(whole + '{"type": "st')
    reader = SpoolReader(tmp_path)
    assert reader.read() == [{"type": "step", "step": 1}]
    with path.open("a") as f:
        f.write('ep", "step": 2}\n')
    assert reader.read() == [{"type": "step", "step": 2}]
    assert reader.read() == []
