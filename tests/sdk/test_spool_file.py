"""An SDK spool file is its owner's alone, and still never written over unless asked."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from detlab.sdk.spool import Spool


def test_a_spool_file_is_created_0600_and_refuses_an_existing_one(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    Spool(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        Spool(path)
    Spool(path, overwrite=True).close()
