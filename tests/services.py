"""Private Redis and PostgreSQL servers for the tests: started on free ports in folders of their own.

Tests share nothing they did not create. The machine's Redis (6379) and PostgreSQL cluster belong to the
people working on it: a test never flushes, stops or restarts them. A server started here can be flushed,
stopped and restarted at will (the fault tests do), and is gone when its fixture ends.

Imports neither the server nor torch, so any layer's tests may use it."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, what: str, timeout: float = 60.0) -> None:
    """Until something accepts TCP connections on 127.0.0.1:`port`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{what} on port {port} did not accept connections in {timeout} s")


@dataclass
class RedisServer:
    """A redis-server of our own: no persistence, so a restart loses every key (as a crashed broker would).
    `databases`: how many indexes it has, so that each test can get one never used before."""

    folder: Path
    port: int = field(default_factory=free_port)
    databases: int = 16
    proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    started: bool = False

    def start(self) -> None:
        """Start it (again: on its port, as a restarted broker would be). The first start moves to another free
        port when its own was taken meanwhile: free_port() only found one free a moment before, and other test
        sessions on the machine pick ports too."""
        for _ in range(5):
            try:
                self._start()
            except RuntimeError:
                if self.started or "Address already in use" not in (self.folder / "redis.log").read_text():
                    raise
                self.port = free_port()
                continue
            self.started = True
            return
        raise RuntimeError(f"redis-server found no free port in 5 tries: see {self.folder}/redis.log")

    def _start(self) -> None:
        # scripts/test-services.sh installs redis-server: its absence is a broken setup, not a skip.
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (`make services` installs it)"
        log = (self.folder / "redis.log").open("ab")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--databases", str(self.databases), "--dir", str(self.folder)],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self._wait_ping()

    def _wait_ping(self, timeout: float = 60.0) -> None:
        import redis

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: see {self.folder}/redis.log")
            try:
                redis.Redis.from_url(self.url(), socket_connect_timeout=0.5).ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise TimeoutError(f"redis-server on port {self.port} did not answer in {timeout} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def postgres_bin() -> Path:
    """The newest PostgreSQL server binaries installed the Debian way (/usr/lib/postgresql/<major>/bin)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    assert found, "PostgreSQL server binaries not found under /usr/lib/postgresql (`make services` installs them)"
    return found[-1].parent


@dataclass
class PostgresServer:
    """A PostgreSQL cluster of our own (initdb, pg_ctl), trusting local TCP connections from 127.0.0.1.

    PostgreSQL refuses to run as root; as root the cluster belongs to the `postgres` system user (the
    Debian package creates it) and its folder lies outside pytest's root-only temp dir."""

    port: int = field(default_factory=free_port)
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="detlab-test-pg-")))

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        out = subprocess.run([*as_user, str(postgres_bin() / args[0]), *args[1:]], capture_output=True, text=True,
                             timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({out.returncode}): {out.stdout}{out.stderr}"
                               f"{self.log() if args[0] == 'pg_ctl' else ''}")

    def log(self) -> str:
        path = self.folder / "postgres.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def init(self) -> None:
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.folder, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self.folder / "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--no-sync")

    def start(self) -> None:
        # No Unix socket (nothing else may connect by accident); fsync off: a test cluster need not survive
        # a power cut, and a restart (pg_ctl stop -m fast) still loses nothing committed.
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c fsync=off "
                   "-c max_connections=200")
        self._run("pg_ctl", "-D", str(self.folder / "data"), "-l", str(self.folder / "postgres.log"), "-o", options,
                  "-w", "-t", "60", "start")
        wait_port(self.port, "postgres")

    def stop(self) -> None:
        """Stop the server, closing every connection (as a crash or a failover would)."""
        self._run("pg_ctl", "-D", str(self.folder / "data"), "-m", "fast", "-w", "-t", "60", "stop")

    def destroy(self) -> None:
        try:
            self.stop()
        except RuntimeError:
            pass  # not running
        shutil.rmtree(self.folder, ignore_errors=True)

    def create_database(self, name: str) -> str:
        """Create database `name`; returns its SQLAlchemy URL."""
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"
