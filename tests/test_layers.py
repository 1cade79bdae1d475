"""Imports run one way: CLI -> server | worker | SDK -> torch layer -> core; the server never reaches the torch layer,
and the worker and the SDK never import each other.

Two checks. Every import statement of the package's source, those inside functions and under TYPE_CHECKING
included (a lazy import is still an arrow), is read from its AST and held against the layer order. And each layer
is imported whole in a fresh process and what it pulled into sys.modules is checked; the wheel adds one import
name."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT

SERVER_STACK = ("fastapi", "starlette", "sqlalchemy", "alembic", "uvicorn", "celery", "kombu", "plotly")
TORCH = ("torch", "triton")
WORKER_FORBIDDEN = ("fastapi", "starlette", "sqlalchemy", "alembic", "uvicorn", "plotly")

# The source folders and the import path each is installed under (pyproject's package-dir).
FOLDERS = {"detlab": "detlab", "backend": "detlab.backend", "worker": "detlab.worker",
           "frontend": "detlab.frontend", "migrations": "detlab.migrations"}

# A module's layer: the first prefix it is, or sits under; the bare `detlab` is the SDK's face (detlab.Recorder).
LAYERS = (("detlab.core", "core"), ("detlab.tensors", "torch layer"), ("detlab.sdk", "sdk"),
          ("detlab.integrations", "sdk"), ("detlab.worker", "worker"), ("detlab.backend", "server"),
          ("detlab.migrations", "server"), ("detlab.frontend", "server"), ("detlab.cli", "cli"),
)
ALL = frozenset({"core", "torch layer", "sdk", "worker", "server", "cli"})
# What each layer may import of detlab, and which third-party packages it must not.
ALLOWED = {"core": {"core"}, "torch layer": {"torch layer", "core"}, "sdk": {"sdk", "torch layer", "core"},
           "worker": {"worker", "torch layer", "core"}, "server": {"server", "core"}, "cli": ALL}
FORBIDDEN = {"core": SERVER_STACK + TORCH + ("safetensors",), "torch layer": SERVER_STACK, "sdk": SERVER_STACK,
             "worker": WORKER_FORBIDDEN, "server": TORCH + ("safetensors",), "cli": ()}


def layer_of(module: str) -> str | None:
    """The layer of a detlab module; None for a module outside detlab."""
    if module == "detlab":
        return "sdk"
    for prefix, layer in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return "unassigned" if module.startswith("detlab.") else None


@dataclass(frozen=True)
class Arrow:
    source: str  # the importing module
    where: str  # path:line
    target: str  # the imported module, as precise as the statement names it


def sources(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package's source tree by its import name."""
    found: dict[str, Path] = {}
    for folder, prefix in FOLDERS.items():
        for path in (root / folder).rglob("*.py"):
            parts = path.relative_to(root / folder).with_suffix("").parts
            found[".".join((prefix, *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path
    return found


def arrows(root: Path = ROOT) -> Iterator[Arrow]:
    """Every import statement of the source tree, wherever in a module it stands."""
    modules = sources(root)
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                yield from (Arrow(module, where, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                for alias in node.names:  # `from detlab.tensors import fingerprint` is an arrow to the subpackage
                    yield Arrow(module, where, sub if (sub := f"{base}.{alias.name}") in modules else base)


def crossings(root: Path = ROOT) -> dict[str, list[str]]:
    """Per layer, the arrows that leave what it may import."""
    found: dict[str, list[str]] = {layer: [] for layer in ALLOWED}
    for arrow in arrows(root):
        source, target = layer_of(arrow.source), layer_of(arrow.target)
        assert source in ALLOWED, f"{arrow.source} is in no layer: add it to LAYERS"
        top = arrow.target.split(".")[0]
        if (target is not None and target not in ALLOWED[source]) or top in FORBIDDEN[source]:
            found[source].append(f"{arrow.where}: {arrow.source} -> {arrow.target}")
    return found


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_every_import_statement_runs_down_the_layers(layer: str) -> None:
    assert crossings()[layer] == []


def test_the_import_reader_sees_lazy_relative_and_type_only_imports() -> None:
    found = {(a.source, a.target) for a in arrows()}
    assert ("detlab", "detlab.sdk.recorder") in found  # under TYPE_CHECKING and inside __getattr__
    assert ("detlab.tensors.fingerprint.torch_impl", "detlab.tensors.fingerprint.reference") in found  # relative
    assert ("detlab.tensors.fingerprint.triton_impl", "triton.language") in found  # a GPU-only module, read all
    assert ("detlab.sdk.recorder", "torch") in found  # inside a method


def test_a_lazy_import_across_the_layers_is_a_crossing(tmp_path: Path) -> None:
    for name, text in {"detlab/__init__.py": "", "detlab/sdk/__init__.py": "", "detlab/tensors/__init__.py": "",
                       "detlab/sdk/rec.py": "def f():\n    from detlab.worker import client\n",
                       "detlab/tensors/fp.py": "def g():\n    if True:\n        import fastapi\n",
                       "worker/__init__.py": "", "worker/client.py": "from ..sdk import rec\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = crossings(tmp_path)
    assert found["sdk"] == ["detlab/sdk/rec.py:2: detlab.sdk.rec -> detlab.worker.client"]
    assert found["torch layer"] == ["detlab/tensors/fp.py:3: detlab.tensors.fp -> fastapi"]
    assert found["worker"] == ["worker/client.py:1: detlab.worker.client -> detlab.sdk.rec"]


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
        if info.name.endswith((".triton_impl", ".drift_triton", ".onepass_triton", "migrations.env")):
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


def test_the_torch_layer_imports_neither_the_server_stack_nor_the_worker_the_sdk_or_the_cli() -> None:
    mods = loaded("detlab.tensors")
    assert "detlab.tensors.digests" in mods
    assert offenders(mods, SERVER_STACK + ("detlab.backend", "detlab.worker", "detlab.sdk", "detlab.integrations",
                                           "detlab.cli")) == []


def test_the_sdk_never_imports_the_worker_or_the_server() -> None:
    mods = loaded("detlab.sdk")
    assert "detlab.sdk.recorder" in mods
    assert offenders(mods, SERVER_STACK + ("detlab.backend", "detlab.worker", "detlab.cli")) == []


def test_the_worker_never_imports_the_server_or_the_sdk() -> None:
    mods = loaded("detlab.worker")
    assert "detlab.worker.ranks.train" in mods
    assert offenders(mods, WORKER_FORBIDDEN + ("detlab.backend", "detlab.sdk", "detlab.integrations",
                                               "detlab.cli")) == []


@pytest.mark.parametrize("name", ["backend", "worker", "frontend", "migrations"])
def test_the_design_folders_are_not_import_names(name: str) -> None:
    out = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, cwd="/")
    assert "ModuleNotFoundError" in out.stderr


def test_the_wheel_holds_one_import_name_with_the_pages_and_migrations(tmp_path: Path) -> None:
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                           check=True, capture_output=True, text=True, timeout=300)
    # the packaging config is complete: setuptools warned, a screenful at every install, of each folder it
    # shipped as data that Python could import (`make run` on a fresh clone)
    assert "absent from the `packages` configuration" not in built.stdout + built.stderr
    names = zipfile.ZipFile(next(tmp_path.glob("detlab-*.whl"))).namelist()
    assert {n.split("/")[0] for n in names} == {"detlab", next(n.split("/")[0] for n in names if ".dist-info" in n)}
    for needed in ("detlab/frontend/index.html", "detlab/frontend/static/app.css", "detlab/migrations/env.py",
                   "detlab/migrations/script.py.mako", "detlab/backend/app.py", "detlab/worker/ranks/train.py"):
        assert needed in names
    assert any(n.startswith("detlab/migrations/versions/") for n in names)
    # every package of the source tree, mapped to its import path (a subpackage missing from pyproject's list
    # is absent from an installed detlab, though an editable install finds it)
    folders = {folder: prefix.replace(".", "/") for folder, prefix in FOLDERS.items()}
    packages = {folders[init.relative_to(ROOT).parts[0]] + "/" + "/".join(init.relative_to(ROOT).parts[1:])
                for folder in folders for init in (ROOT / folder).rglob("__init__.py")}
    assert packages - set(names) == set()
