"""All runtime settings in one place, read from the environment (prefix DETLAB_)."""

from __future__ import annotations

import secrets
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DETLAB_", extra="ignore")

    mode: Literal["embedded", "distributed"] = "embedded"
    data_dir: Path = Path(".detlab")
    database_url: str | None = None  # default: SQLite file under data_dir
    broker_url: str | None = None  # default: kombu filesystem transport under data_dir
    # none: no users, listens on 127.0.0.1 only. proxy: an authenticating reverse proxy in front sets
    # proxy_user_header; submissions without it are refused.
    auth_mode: Literal["none", "proxy"] = "none"
    proxy_user_header: str = "X-Forwarded-User"
    ingest_token: str | None = None
    api_url: str = "http://127.0.0.1:8000"
    queue: str = "default"
    device: Literal["auto", "cpu", "cuda"] = "auto"  # where a worker's ranks run
    # A run whose worker has not sent a heartbeat for this long is re-dispatched (or failed).
    heartbeat_interval_s: float = 2.0
    run_stale_after_s: float = 30.0
    max_attempts: int = 2
    # A run any of whose ranks writes nothing for this long is killed, naming the rank (raise it for long
    # fingerprint intervals).
    hang_timeout_s: float = 600.0
    # Until its first step a rank builds its model, joins NCCL and may compile: allowed this long instead.
    first_step_timeout_s: float = 1800.0
    reconcile_interval_s: float = 5.0
    max_body_bytes: int = 8 * 1024 * 1024
    max_world_size: int = 64
    max_steps: int = 100_000
    max_repeats: int = 20
    # A job's runs × world size × steps (cells for collectives): what it would occupy the workers with.
    max_rank_steps: int = 5_000_000
    # Worker: gloo ranks it starts per CPU core (small CPU workloads share a core well; W=64 on 2 cores does
    # not). It reports cores × this in its heartbeat; the server refuses larger world sizes on its queue.
    cpu_ranks_per_core: int = Field(default=4, ge=1, le=64)

    @model_validator(mode="after")
    def _refuse_insecure_distributed(self) -> Settings:
        if self.mode == "distributed":
            if not self.database_url or not self.broker_url:
                raise ValueError("distributed mode needs DETLAB_DATABASE_URL and DETLAB_BROKER_URL")
            if not self.ingest_token or len(self.ingest_token) < 16:
                raise ValueError("distributed mode needs DETLAB_INGEST_TOKEN of at least 16 characters")
        return self

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{(self.data_dir / 'detlab.sqlite3').resolve()}"

    def resolved_broker_url(self) -> str:
        return self.broker_url or "filesystem://localhost/"  # a host name keeps kombu from warning

    def broker_folder(self) -> Path:
        folder = (self.data_dir / "broker").resolve()
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def resolved_ingest_token(self) -> str:
        """The configured token, or (embedded) one generated once and kept in the data dir."""
        if self.ingest_token:
            return self.ingest_token
        path = self.data_dir / "ingest-token"
        if not path.exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_urlsafe(32))
            path.chmod(0o600)
        return path.read_text().strip()


@lru_cache
def get_settings() -> Settings:
    return Settings()
