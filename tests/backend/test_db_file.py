"""The embedded database file is its owner's alone: it holds password hashes, tokens' digests and every record."""

from __future__ import annotations

import stat
from pathlib import Path

from sqlalchemy import text

from detlab.backend.db import make_engine


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_sqlite_file_and_its_wal_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "detlab.sqlite3"
    engine = make_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
        conn.execute(text("INSERT INTO t VALUES (1)"))
        assert mode(path) == 0o600
        assert mode(tmp_path / "detlab.sqlite3-wal") == 0o600
    engine.dispose()


def test_an_existing_world_readable_file_is_made_private(tmp_path: Path) -> None:
    path = tmp_path / "detlab.sqlite3"
    path.touch(mode=0o644)
    path.chmod(0o644)
    make_engine(f"sqlite:///{path}").dispose()
    assert mode(path) == 0o600
