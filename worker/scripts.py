"""A team's own training scripts, registered on a worker node: `detlab worker --scripts FILE`.

The file is TOML, one `[[script]]` table per script:

    [[script]]
    name = "llama-8b-sft"                       # what jobs name as their workload
    description = "SFT recipe, 2 layers"
    command = ["python", "train.py", "--steps", "50"]   # argv, never a shell string
    workdir = "/srv/recipes"                    # default: the worker's working directory
    world_sizes = [1, 2, 4]                     # default: any the node can hold
    steps = 50                                  # the steps it records (a run that records fewer is incomplete)
    global_batch = 32                           # samples per step, for throughput (default 1)

A comparison job runs a script like a built-in workload: each rank is the command with torchrun's variables,
the config's allow-listed environment (to the ranks only), and DETLAB_RUN_DIR, where the script's
`detlab.Recorder` writes its records whatever out= it was given, for the worker to stream (docs/sdk.md,
"Scripts run by a worker"). The browser sends only the script's name: nothing it sends is executed.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from detlab.core.wire import MAX_WORLD_SIZE, explain
from detlab.core.workloads import BUILTIN, WorkloadInfo


class ScriptsError(ValueError):
    """The scripts file cannot be used; the message names the file and the entry."""


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    description: str = Field(default="", max_length=500)
    command: tuple[str, ...] = Field(min_length=1, max_length=256)
    workdir: Path | None = None
    world_sizes: tuple[int, ...] | None = Field(default=None, min_length=1, max_length=64)
    steps: int = Field(default=20, ge=1, le=1_000_000)
    global_batch: int = Field(default=1, ge=1, le=1 << 20)

    @field_validator("command")
    @classmethod
    def _argv(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if any(not arg or "\0" in arg for arg in v):
            raise ValueError("every argument is a non-empty string without NUL")
        return v

    @field_validator("world_sizes")
    @classmethod
    def _worlds(cls, v: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if v is not None and not all(1 <= w <= MAX_WORLD_SIZE for w in v):
            raise ValueError(f"world sizes lie in 1..{MAX_WORLD_SIZE}")
        return v

    def info(self) -> WorkloadInfo:
        return WorkloadInfo(name=self.name, description=self.description or " ".join(self.command)[:500],
                            global_batch=self.global_batch, default_steps=self.steps, script=True,
                            world_sizes=self.world_sizes)


def load(path: Path) -> dict[str, Script]:
    """The scripts of a file, by name; ScriptsError says what is wrong, where."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ScriptsError(f"{path}: cannot read it as TOML ({exc})") from None
    unknown = set(data) - {"script"}
    if unknown or not isinstance(data.get("script", []), list):
        raise ScriptsError(f"{path}: expected only [[script]] tables, found {sorted(unknown) or 'script = ...'}")
    found: dict[str, Script] = {}
    for i, entry in enumerate(data.get("script", [])):
        try:
            script = Script.model_validate(entry)
        except ValidationError as exc:
            raise ScriptsError(f"{path}: script {i + 1}: {explain(exc)}") from None
        if script.name in BUILTIN or script.name in found or script.name == "collective":
            raise ScriptsError(f"{path}: script {i + 1}: the name {script.name!r} is taken")
        if script.workdir is not None and not script.workdir.is_dir():
            raise ScriptsError(f"{path}: script {script.name}: workdir {script.workdir} is not a directory")
        found[script.name] = script
    return found


def registered() -> dict[str, Script]:
    """This worker's scripts (DETLAB_SCRIPTS, set by `detlab worker --scripts FILE`); none without the file."""
    from detlab.core.settings import get_settings

    path = get_settings().scripts
    return load(path) if path is not None else {}
