"""All runtime settings in one place, read from the environment (prefix DETLAB_)."""

from __future__ import annotations

import ipaddress
import secrets
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

# A list setting from the environment: comma-separated (`DETLAB_ALLOWED_HOSTS=localhost,detlab.example.com`).
CommaList = Annotated[list[str], NoDecode]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DETLAB_", extra="ignore")

    mode: Literal["embedded", "distributed"] = "embedded"
    data_dir: Path = Path(".detlab")
    database_url: str | None = None  # default: SQLite file under data_dir
    broker_url: str | None = None  # default: kombu filesystem transport under data_dir
    # none: no users, listens on 127.0.0.1 only. proxy: an authenticating reverse proxy in front sets
    # proxy_user_header, trusted only from trusted_proxies. local: users and API tokens in the database
    # (`detlab user add`, `detlab token create`), browser sessions by cookie. Outside `none` every endpoint
    # but health needs an identity.
    auth_mode: Literal["none", "proxy", "local"] = "none"
    proxy_user_header: str = "X-Forwarded-User"
    # Addresses or networks (CIDR) the proxy connects from; the user header from any other peer is refused.
    trusted_proxies: CommaList = ["127.0.0.1", "::1"]
    # Host header values served (DNS rebinding); `detlab api --host NAME` adds NAME.
    allowed_hosts: CommaList = ["localhost", "127.0.0.1", "::1"]
    # The session cookie's Secure flag; unset: set when the request came over https (behind a proxy that
    # terminates TLS the API sees http: set it true).
    session_cookie_secure: bool | None = None
    session_ttl_s: int = Field(default=7 * 24 * 3600, ge=60)
    # Wrong logins allowed per account and per client address within the window, then 429 until the oldest
    # leaves it; password hashes computed at once (argon2id takes 64 MiB each: a login flood must not).
    login_window_s: float = Field(default=300.0, gt=0)
    login_failures_per_account: int = Field(default=10, ge=1)
    login_failures_per_address: int = Field(default=50, ge=1)
    login_concurrent_hashes: int = Field(default=2, ge=1, le=64)
    # Jobs have an owner (their submitter): only the owner or an admin edits tags, cancels or reruns one. True: any
    # user who may submit may do so to any job (a team that shares its jobs).
    shared_jobs: bool = False
    token: str | None = None  # DETLAB_TOKEN: the API token the CLI sends (`detlab token create`)
    # The server's shared worker credential (generated into the data dir when unset, embedded). A worker sends
    # worker_token when set (an API token with scope `worker`, revocable per node), else this.
    ingest_token: str | None = None
    worker_token: str | None = None
    api_url: str = "http://127.0.0.1:8000"
    queue: str = "default"
    device: Literal["auto", "cpu", "cuda"] = "auto"  # where a worker's ranks run
    scripts: Path | None = None  # worker: the team's registered training scripts (a TOML file; worker.scripts)
    # A run whose worker has not sent a heartbeat for this long is re-dispatched (or failed).
    heartbeat_interval_s: float = 2.0
    run_stale_after_s: float = 30.0
    max_attempts: int = 2
    # Worker: how long a record batch, a log or a run's finish is tried again through an outage of the API or
    # its database (the records wait in the run's spool meanwhile), before the run fails.
    ingest_retry_s: float = Field(default=900.0, ge=0)
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

    @field_validator("trusted_proxies", "allowed_hosts", mode="before")
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        return [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value

    @field_validator("trusted_proxies")
    @classmethod
    def _refuse_trusting_everyone(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                network = ipaddress.ip_network(entry, strict=False)
            except ValueError as exc:
                raise ValueError(f"DETLAB_TRUSTED_PROXIES: {entry!r} is not an IP address or network") from exc
            if network.prefixlen == 0:
                raise ValueError(f"DETLAB_TRUSTED_PROXIES: {entry!r} trusts every address, so anyone could "
                                 "set the user header; name the proxy's address")
        return value

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts_are_names(cls, value: list[str]) -> list[str]:
        if "*" in value:
            raise ValueError("DETLAB_ALLOWED_HOSTS: '*' would accept any Host (DNS rebinding); list the names")
        return [v.lower().strip("[]") for v in value]

    @model_validator(mode="after")
    def _refuse_insecure_distributed(self) -> Settings:
        if self.mode == "distributed":
            if not self.database_url or not self.broker_url:
                raise ValueError("distributed mode needs DETLAB_DATABASE_URL and DETLAB_BROKER_URL")
            if self.ingest_token is not None and len(self.ingest_token) < 16:
                raise ValueError("distributed mode needs DETLAB_INGEST_TOKEN of at least 16 characters")
            if not self.ingest_token and not self.worker_token:
                raise ValueError("distributed mode needs DETLAB_INGEST_TOKEN of at least 16 characters (or, on a "
                                 "worker, its own DETLAB_WORKER_TOKEN)")
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

    def resolved_worker_token(self) -> str:
        """What a worker sends to ingest: its own token with scope `worker`, else the server's ingest token."""
        return self.worker_token or self.resolved_ingest_token()

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
