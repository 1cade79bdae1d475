"""Alembic migrations: upgrade, downgrade, upgrade again, and no drift from the models."""

from __future__ import annotations

import json

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, inspect, text

from detlab.backend.db import make_engine
from detlab.backend.models import Base
from detlab.migrations import alembic_config

pytestmark = pytest.mark.both_databases  # the store itself: SQLite (embedded) and PostgreSQL


def test_upgrade_downgrade_upgrade(db_url: str) -> None:
    config = alembic_config(db_url)
    command.upgrade(config, "head")
    command.downgrade(config, "base")
    engine = make_engine(db_url)
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    command.upgrade(config, "head")
    assert set(Base.metadata.tables) <= set(inspect(engine).get_table_names())
    engine.dispose()


def test_models_have_no_drift_from_migrations(db_url: str) -> None:
    command.upgrade(alembic_config(db_url), "head")
    engine = make_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    engine.dispose()
    assert diff == []


def _insert_job(conn: Connection, **values: object) -> None:
    row = {"kind": "train", "workload": "mlp", "world_size": 1, "steps": 3, "repeats": 1, "config_ids": "[]",
           "status": "succeeded", "queue": "default", "created_at": "2026-11-30 12:00:00+00:00", **values}
    conn.execute(text(f"INSERT INTO jobs ({', '.join(row)}) VALUES ({', '.join(':' + k for k in row)})"), row)


def test_job_results_migrate_up_and_down_keeping_verdicts(db_url: str) -> None:
    config = alembic_config(db_url)
    command.upgrade(config, "0003")
    engine = make_engine(db_url)
    with engine.begin() as conn:
        _insert_job(conn, id=1, params=json.dumps({"verdict": "diverged"}))  # settled before 0004
    command.upgrade(config, "0004")
    with engine.begin() as conn:
        assert conn.execute(text("SELECT result FROM jobs WHERE id = 1")).scalar() is None
        _insert_job(conn, id=2, params=json.dumps({}), result=json.dumps({"verdict": "identical", "per_step": []}))
    command.downgrade(config, "0003")
    assert "result" not in {c["name"] for c in inspect(engine).get_columns("jobs")}
    with engine.connect() as conn:
        params = dict(conn.execute(text("SELECT id, params FROM jobs ORDER BY id")).all())
    verdicts = {i: (json.loads(p) if isinstance(p, str) else p)["verdict"] for i, p in params.items()}
    assert verdicts == {1: "diverged", 2: "identical"}
    command.upgrade(config, "head")
    engine.dispose()


def test_job_tags_migrate_with_verdicts_read_from_results(db_url: str) -> None:
    config = alembic_config(db_url)
    command.upgrade(config, "0006")
    engine = make_engine(db_url)
    cells = {"cells": [{"reproducible": True}, {"reproducible": False}]}
    with engine.begin() as conn:
        _insert_job(conn, id=1, params=json.dumps({}), result=json.dumps({"verdict": "diverged"}))
        _insert_job(conn, id=2, kind="collective", params=json.dumps({}), result=json.dumps(cells))
        _insert_job(conn, id=3, params=json.dumps({"verdict": "identical"}))  # settled before 0004
        _insert_job(conn, id=4, status="running", params=json.dumps({}))
    command.upgrade(config, "0007")
    with engine.begin() as conn:
        rows = conn.execute(text("SELECT id, verdict, tags FROM jobs ORDER BY id")).all()
        assert [(i, v) for i, v, _ in rows] == [(1, "diverged"), (2, "not-reproducible"), (3, "identical"),
                                                (4, None)]
        assert all((json.loads(t) if isinstance(t, str) else t) == [] for _, _, t in rows)
        conn.execute(text("INSERT INTO job_tags (job_id, tag) VALUES (1, 'h200')"))
    command.downgrade(config, "0006")
    assert "job_tags" not in inspect(engine).get_table_names()
    assert not {"tags", "verdict"} & {c["name"] for c in inspect(engine).get_columns("jobs")}
    command.upgrade(config, "head")
    engine.dispose()


def test_recording_ids_move_from_idempotency_keys_to_their_column_and_back(db_url: str) -> None:
    config = alembic_config(db_url)
    command.upgrade(config, "0008")
    engine = make_engine(db_url)
    with engine.begin() as conn:
        _insert_job(conn, id=1, kind="recording", workload="sdk", params=json.dumps({}), tags="[]")
        _insert_job(conn, id=2, params=json.dumps({}), tags="[]")
        conn.execute(text("INSERT INTO configs (id, name, hash, body, created_at) "
                          "VALUES (1, 'recorded', 'h', '{}', '2026-11-30 12:00:00+00:00')"))
        conn.execute(text("INSERT INTO runs (job_id, config_id, config_index, repeat, world_size, steps_total, "
                          "steps_done, status, attempt) VALUES (1, 1, 0, 0, 1, 0, 0, 'running', 1)"))
        for key, job_id in (("recording:abcdef0123", 1), ("client-key-1", 2)):
            conn.execute(text("INSERT INTO idempotency_keys (key, body_hash, job_id, created_at) "
                              "VALUES (:k, 'h', :j, '2026-11-30 12:00:00+00:00')"), {"k": key, "j": job_id})
    command.upgrade(config, "0009")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT id, recording FROM jobs ORDER BY id")).all() == [(1, "abcdef0123"), (2, None)]
        assert conn.execute(text("SELECT key FROM idempotency_keys")).scalars().all() == ["client-key-1"]
    command.downgrade(config, "0008")
    with engine.connect() as conn:
        keys = conn.execute(text("SELECT key, job_id FROM idempotency_keys ORDER BY key")).all()
    assert keys == [("client-key-1", 2), ("recording:abcdef0123", 1)]
    with engine.connect() as conn:  # SQLite copies `jobs` to drop the column: nothing of its jobs may go with it
        assert conn.execute(text("SELECT job_id FROM runs")).scalars().all() == [1]
    command.upgrade(config, "head")
    engine.dispose()


def test_a_resumed_recordings_restored_records_go_on_downgrade_and_its_first_records_stay(db_url: str) -> None:
    config = alembic_config(db_url)
    command.upgrade(config, "0015")
    engine = make_engine(db_url)
    with engine.begin() as conn:
        _insert_job(conn, id=1, kind="recording", workload="sdk", params=json.dumps({}), tags="[]")
        conn.execute(text("INSERT INTO configs (id, name, hash, body, created_at) "
                          "VALUES (1, 'recorded', 'h', '{}', '2026-11-30 12:00:00+00:00')"))
        conn.execute(text("INSERT INTO runs (id, job_id, config_id, config_index, repeat, world_size, steps_total, "
                          "steps_done, status, attempt) VALUES (1, 1, 1, 0, 0, 1, 0, 0, 'running', 1)"))
        for segment in (0, 1):  # step 2 saved, then restored: one row per segment
            conn.execute(text("INSERT INTO step_records (run_id, step, rank, attempt, fp_version, model_digest, "
                              "digests, loss_bits, step_time_s, segment, restored) VALUES (1, 2, 0, 1, 'fp2', 'd', "
                              ":b, '', 0, :s, :r)"), {"b": b"", "s": segment, "r": bool(segment)})
    command.downgrade(config, "0013")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT step FROM step_records")).scalars().all() == [2]
    command.upgrade(config, "head")
    engine.dispose()
