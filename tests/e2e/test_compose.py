"""docker-compose.yml agrees with the CLI and the settings it drives (no Docker needed)."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml
from pydantic import ValidationError

from detlab.cli import app
from detlab.core.settings import Settings

COMPOSE_FILE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
REQUIRED_SERVICES = {"postgres", "redis", "migrate", "api", "worker"}
DETLAB_SERVICES = ("migrate", "api", "worker")
# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error}
INTERPOLATION = re.compile(r"\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")
# Values for the variables the file requires (${VAR:?...}); a token of the minimum length.
REQUIRED_VALUES = {"POSTGRES_PASSWORD": "compose-test-password", "DETLAB_INGEST_TOKEN": "t" * 16}
VALID_DISTRIBUTED: dict[str, Any] = {"mode": "distributed", "database_url": "postgresql+psycopg://detlab:pw@postgres:5432/detlab",
                     "broker_url": "redis://redis:6379/0", "ingest_token": "t" * 16}


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def service(name: str) -> dict[str, Any]:
    return compose()["services"][name]


def environment(name: str) -> dict[str, str]:
    env = service(name).get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


def interpolate(value: str) -> str:
    """What Compose would substitute, with REQUIRED_VALUES standing in for the operator's variables."""
    def substitute(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        if name in REQUIRED_VALUES:
            return REQUIRED_VALUES[name]
        if op and op.endswith("?"):
            raise AssertionError(f"${{{name}}} is required by the compose file; add it to REQUIRED_VALUES")
        return arg if op else ""

    return INTERPOLATION.sub(substitute, value)


def command(name: str) -> list[str]:
    cmd = service(name).get("command")
    assert cmd, f"service {name} has no command"
    return [interpolate(str(part)) for part in cmd] if isinstance(cmd, list) else shlex.split(interpolate(cmd))


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No DETLAB_* from the developer's shell may leak into a Settings under test."""
    for key in list(os.environ):
        if key.startswith("DETLAB_"):
            monkeypatch.delenv(key)
    return monkeypatch


def test_required_services_exist() -> None:
    missing = REQUIRED_SERVICES - set(compose()["services"])
    assert not missing, f"docker-compose.yml lacks services {sorted(missing)}"


@pytest.mark.parametrize("name", ["postgres", "redis"])
def test_backing_service_has_healthcheck(name: str) -> None:
    check = service(name).get("healthcheck") or {}
    assert check.get("test") and not check.get("disable"), f"{name} needs a healthcheck for depends_on to wait on"


@pytest.mark.parametrize("name", DETLAB_SERVICES)
def test_service_runs_a_registered_cli_command(name: str) -> None:
    argv = command(name)
    assert argv[0] == "detlab", f"{name} runs {argv!r}, not a detlab command"
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    assert len(argv) > 1 and argv[1] in commands, f"{name}: 'detlab {argv[1:2]}' is not one of {sorted(commands)}"
    options = {opt for param in commands[argv[1]].params for opt in param.opts}
    unknown = {arg.split("=", 1)[0] for arg in argv[2:] if arg.startswith("--")} - options
    assert not unknown, f"{name}: 'detlab {argv[1]}' has no options {sorted(unknown)}"


def test_worker_holds_no_database_credentials() -> None:
    env = environment("worker")
    assert "DETLAB_DATABASE_URL" not in env, "workers must reach the database only through the ingest API"
    leaks = [key for key, value in env.items() if "POSTGRES" in key or "POSTGRES_PASSWORD" in value]
    assert not leaks, f"worker environment carries database secrets in {leaks}"


def test_worker_disables_nvls() -> None:
    assert environment("worker").get("NCCL_NVLS_ENABLE") == "0"


def test_worker_reserves_all_gpus() -> None:
    devices = service("worker").get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    gpus = [d for d in devices if d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", [])]
    assert gpus, "the worker reserves no NVIDIA GPU"
    assert gpus[0].get("count") == "all" or gpus[0].get("device_ids"), "the worker reserves GPUs without a count"


def test_depends_on_targets_exist() -> None:
    services = compose()["services"]
    for name, spec in services.items():
        targets = spec.get("depends_on") or []
        unknown = set(targets) - set(services)
        assert not unknown, f"{name} depends on unknown services {sorted(unknown)}"


def test_published_ports_bind_loopback_only() -> None:
    published = {name: spec["ports"] for name, spec in compose()["services"].items() if spec.get("ports")}
    assert "api" in published, "the API port is not published"
    for name, ports in published.items():
        for port in ports:
            host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).rsplit(":", 2)[0]
            assert host_ip == "127.0.0.1", f"{name} publishes {port!r} beyond the host's loopback"


def test_every_detlab_variable_is_a_setting() -> None:
    text = COMPOSE_FILE.read_text()
    used = {m["name"] for m in INTERPOLATION.finditer(text)} | {
        key for name in compose()["services"] for key in environment(name)}
    detlab = {name for name in used if name.startswith("DETLAB_")}
    assert detlab, "no DETLAB_ variable found: the compose file or this test's parsing changed"
    unknown = {name for name in detlab if name.removeprefix("DETLAB_").lower() not in Settings.model_fields}
    assert not unknown, f"{sorted(unknown)} are not fields of detlab.core.settings.Settings"


@pytest.mark.parametrize("name", DETLAB_SERVICES)
def test_service_environment_makes_valid_settings(name: str, clean_env: pytest.MonkeyPatch) -> None:
    # The worker gets no database URL, so it must not claim distributed mode (which requires one).
    for key, value in environment(name).items():
        clean_env.setenv(key, interpolate(value))
    settings = Settings()
    if name != "worker":
        assert settings.mode == "distributed"
        assert settings.database_url and settings.database_url.startswith("postgresql+psycopg://")
    assert settings.broker_url and settings.broker_url.startswith("redis://")


def test_api_auth_mode_allows_binding_all_interfaces(clean_env: pytest.MonkeyPatch) -> None:
    argv = command("api")
    host = argv[argv.index("--host") + 1] if "--host" in argv else "127.0.0.1"
    for key, value in environment("api").items():
        clean_env.setenv(key, interpolate(value))
    auth_mode = Settings().auth_mode
    assert host in ("127.0.0.1", "localhost", "::1") or auth_mode != "none", \
        f"`detlab api --host {host}` refuses to start with DETLAB_AUTH_MODE=none"


@pytest.mark.parametrize("override", [{"database_url": None}, {"broker_url": None}, {"ingest_token": None},
                                      {"ingest_token": "t" * 15}],
                         ids=["no-database", "no-broker", "no-token", "short-token"])
def test_distributed_settings_refuse_incomplete(override: dict[str, Any], clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="distributed mode needs"):
        Settings(**{**VALID_DISTRIBUTED, **override})


def test_a_distributed_worker_may_hold_its_own_worker_token_instead(clean_env: pytest.MonkeyPatch) -> None:
    settings = Settings(**{**VALID_DISTRIBUTED, "ingest_token": None, "worker_token": "detlab_node-token"})
    assert settings.resolved_worker_token() == "detlab_node-token"


def test_distributed_settings_accept_complete(clean_env: pytest.MonkeyPatch) -> None:
    settings = Settings(**VALID_DISTRIBUTED)
    assert settings.mode == "distributed"
