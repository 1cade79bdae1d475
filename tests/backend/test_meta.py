"""GET /api/v1/meta: the lists and limits the pages build their forms from come from the core and settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from detlab.backend.kinds.collective import MAX_SIZES
from detlab.backend.kinds.registry import KINDS
from detlab.backend.kinds.sweep import MAX_SWEEP_CELLS
from detlab.backend.models import TAG_LENGTH
from detlab.backend.schemas import VERDICTS
from detlab.core.collective import DTYPE_BYTES, DTYPES, OPS
from detlab.core.settings import Settings
from detlab.core.wire import MAX_TAGS, TAG_PATTERN


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # Limits unlike the defaults, so the test sees they are read from this server's settings.
    return Settings(data_dir=tmp_path, max_world_size=3, max_steps=7, max_repeats=5)


def test_meta_lists_the_cores_ops_and_dtypes_in_its_order(client: TestClient) -> None:
    body = client.get("/api/v1/meta").json()
    assert (body["ops"], body["dtypes"], body["dtype_bytes"]) == (list(OPS), list(DTYPES), DTYPE_BYTES)


def test_meta_limits_are_this_servers_settings(client: TestClient) -> None:
    limits = client.get("/api/v1/meta").json()["limits"]
    assert limits == {"max_world_size": 3, "max_steps": 7, "max_repeats": 5, "max_sweep_cells": MAX_SWEEP_CELLS,
                      "max_sizes": MAX_SIZES, "max_tags": MAX_TAGS, "max_tag_length": TAG_LENGTH,
                      "tag_pattern": TAG_PATTERN}


def test_meta_lists_what_the_jobs_list_filters_on(client: TestClient) -> None:
    body = client.get("/api/v1/meta").json()
    assert body["job_statuses"] == ["queued", "running", "succeeded", "failed", "cancelled"]
    assert (body["job_kinds"], body["verdicts"]) == (list(KINDS), list(VERDICTS))


def test_meta_lists_the_kinds_of_the_registry_with_where_their_results_are(client: TestClient) -> None:
    kinds = {k["name"]: k for k in client.get("/api/v1/meta").json()["kinds"]}
    assert list(kinds) == list(KINDS)
    assert {name for name, k in kinds.items() if k["submit"]} == {"train", "collective", "sweep", "batch-invariance",
                                                                  "op-audit", "fix", "resume"}
    assert (kinds["train"]["result"], kinds["collective"]["result"], kinds["op-audit"]["result"],
            kinds["sweep"]["result"], kinds["fix"]["result"]) == (
        "comparison", "collective", "diagnosis", None, "fix")  # a sweep's: its `over`'s
