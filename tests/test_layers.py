"""Imports run one way: CLI -> server | worker -> core. Each layer is imported whole in a fresh
process and what it pulled into sys.modules is checked; the wheel adds one import name."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

SERVER_STACK = ("fastapi", "starlette", "sqlalchemy", "alembic", "uvicorn", "celery", "kombu", "plotly")
TORCH = ("torch", "triton")

# Imports packages (with "walk": every module in them), then prints the top-level and detlab modules loaded.
PROBE = """
import importlib, json, pkgutil, sys
skipped = []
walk = sys.argv[1] == "walk"
for name in sys.argv[2:]:
    mod = importlib.import_module(name)
    for info in pkgutil.walk_packages(getattr(mod, "__path__", []) if walk else [], name + "."):
        # Triton is a GPU-only dependency; alembic's env.py runs only inside alembic (its imports are
        # the server's db and models, imported here anyway).
        if info.name.endswith((".triton_impl", ".drift_triton", "migrations.env")):
            skipped.append(info.name)
            continue
        importlib.import_module(info.name)
print(json.dumps({"modules": sorted(sys.modules), "skipped": skipped}))
"""


def loaded(*packages: str, walk: bool = True) -> set[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, "walk" if walk else "top", *packages],
                         capture_output=True, text=True, cwd="/", timeout=120)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout)["modules"])


def offenders(modules: set[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in forbidden or m.startswith(forbidden))


def test_import_detlab_is_light() -> None:
    mods = loaded("detlab", walk=False)
    assert offenders(mods, SERVER_STACK + TORCH + ("detlab.backend", "detlab.worker", "numpy")) == []


def test_the_core_imports_neither_the_server_stack_nor_torch_nor_either_side() -> None:
    mods = loaded("detlab.core")
    assert offenders(mods, SERVER_STACK + TORCH + ("detlab.backend.", "detlab.worker.", "detlab.cli")) == []


def test_the_server_never_imports_torch_or_the_worker() -> None:
    mods = loaded("detlab.backend", "detlab.migrations")
    assert "detlab.backend.app" in mods
    assert offenders(mods, TORCH + ("detlab.worker",)) == []


def test_the_worker_never_imports_the_server() -> None:
    mods = loaded("detlab.worker")
    assert "detlab.worker.ranks.train" in mods
    assert offenders(mods, ("fastapi", "starlette", "sqlalchemy", "alembic", "plotly", "detlab.backend")) == []


@pytest.mark.parametrize("name", ["backend", "worker", "frontend", "migrations"])
def test_the_design_folders_are_not_import_names(name: str) -> None:
    out = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, cwd="/")
    assert "ModuleNotFoundError" in out.stderr


def test_the_wheel_holds_one_import_name_with_the_pages_and_migrations(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    names = zipfile.ZipFile(next(tmp_path.glob("detlab-*.whl"))).namelist()
    assert {n.split("/")[0] for n in names} == {"detlab", next(n.split("/")[0] for n in names if ".dist-info" in n)}
    for needed in ("detlab/frontend/index.html", "detlab/frontend/static/app.css", "detlab/migrations/env.py",
                   "detlab/migrations/script.py.mako", "detlab/backend/app.py", "detlab/worker/ranks/train.py"):
        assert needed in names
    assert any(n.startswith("detlab/migrations/versions/") for n in names)
    # every package of the source tree, mapped to its import path (a subpackage missing from pyproject's list
    # is absent from an installed detlab, though an editable install finds it)
    folders = {"detlab": "detlab", "backend": "detlab/backend", "worker": "detlab/worker",
               "frontend": "detlab/frontend", "migrations": "detlab/migrations"}
    packages = {folders[init.relative_to(ROOT).parts[0]] + "/" + "/".join(init.relative_to(ROOT).parts[1:])
                for folder in folders for init in (ROOT / folder).rglob("__init__.py")}
    assert packages - set(names) == set()
