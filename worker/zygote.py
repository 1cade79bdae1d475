"""A fork server for rank programs: one process that has imported torch and the rank programs once, and forks a
rank per launch instead of starting a Python that imports them again.

A fresh rank process spends ~7 s of CPU on a 2-core machine before and after its training: importing torch and the
rank program (3.7 s), torch._dynamo, which DDP's constructor imports (2.3 s), and the interpreter's teardown of
torch's modules at exit (1.6 s). Most runs train for less. The zygote imports once per worker process; a forked
rank is what `python -m <program> spec.json` would be: the program runs as `__main__` with the rank's argv,
environment, working directory and output file, in a session (process group) of its own, and ends as forked
children end (exit handlers run, output flushed, then `os._exit`, with no module teardown).

Two differences, about the process and not the training: ranks share the zygote's string-hash seed, and a value
read when Python, torch or a library loads comes from the zygote's environment. So a rank is only forked when its
environment differs from the zygote's in variables that are read once a rank uses them (`LAZY_ENV`: torchrun's,
OMP_NUM_THREADS, which a forked rank applies with torch.set_num_threads, NCCL_*, CUBLAS_WORKSPACE_CONFIG); any other
difference (LD_PRELOAD, MKL_*, TORCH_*, a removed variable) starts a fresh process as before. DETLAB_FORK_RANKS=0
turns forking off. The zygote never initialises CUDA (a child of a process that has cannot use it) and refuses to
serve if loading did.

Forked ranks die with the launcher: the zygote kills every rank it forked when its stdin closes (the launcher
exited, however it exited), and each rank has the kernel kill it when the zygote dies.

Protocol, one JSON object a line: the launcher writes `{"id", "module", "argv", "env", "cwd", "out"}`; the zygote
answers `{"ready": true}` (or `{"ready": false, "error"}`) once loaded, `{"id", "pid"}` or `{"id", "error"}` per
request, and `{"pid", "exit"}` when a rank ends (the exit code as subprocess gives it: negative for a signal).

Usage (by the launcher): python -m detlab.worker.zygote MODULE...
"""

from __future__ import annotations

import atexit
import ctypes
import importlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Mapping
from typing import IO, Any, NoReturn

log = logging.getLogger(__name__)

TORCHRUN_ENV = frozenset({"MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                          "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE"})
# Variables that nothing reads before a rank uses them: a rank may differ from the zygote in these and be forked.
# OMP_NUM_THREADS is read when OpenMP loads; a forked rank applies it with torch.set_num_threads instead.
# PYTEST_CURRENT_TEST: pytest sets it per test and no library reads it; a launching test forks its ranks too.
LAZY_ENV = TORCHRUN_ENV | {"OMP_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG", "PYTEST_CURRENT_TEST"}
LAZY_PREFIXES = ("NCCL_",)
READY_TIMEOUT_S = 120.0
# Imported by torch on first use, not at `import torch`: DDP's constructor imports torch._dynamo (2.3 s of CPU).
LATE_IMPORTS = ("torch._dynamo",)


def only_lazy_differences(base: Mapping[str, str], env: Mapping[str, str], lazy: frozenset[str] = LAZY_ENV) -> bool:
    """Whether every variable set in one of `base` and `env` and not the other, or set to different values, is one
    read only once a rank runs (`lazy`, or NCCL's)."""
    return all(k in lazy or k.startswith(LAZY_PREFIXES) for k in base.keys() | env.keys() if base.get(k) != env.get(k))


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """For Popen's preexec_fn (and a forked rank): the process gets `sig` when its parent dies, however the parent
    died. A SIGKILLed worker must not leave ranks training into a spool nobody reads."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG


# --- the zygote process ---------------------------------------------------------------------------------------

def _preload(modules: Iterable[str]) -> None:
    """Import what ranks use, and load the CPU fingerprint and sketch kernels from numba's disk cache (no torch
    op, no thread pool, no CUDA)."""
    for module in (*modules, *LATE_IMPORTS):
        importlib.import_module(module)
    try:
        import numpy as np

        from detlab.tensors import drift_numba
        from detlab.tensors.fingerprint import cpu_impl
    except ImportError:
        return
    if cpu_impl.available():
        cpu_impl.fingerprint_array(np.zeros(8, dtype=np.uint8))
    if drift_numba.available():
        drift_numba.warm()


def _child(request: dict[str, Any]) -> int:
    """In the forked rank: become `python -m module argv...` and run it; returns the exit code."""
    die_with_parent()  # the zygote is single-threaded: the thread that forked is the zygote
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    os.close(stdin)
    out = os.open(request["out"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if threads := os.environ.get("OMP_NUM_THREADS"):
        import torch

        torch.set_num_threads(int(threads))
    module = request["module"]
    sys.modules.pop(module, None)  # run afresh as __main__, as `python -m` would
    sys.argv = [module, *request["argv"]]
    import runpy

    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _exit(code: int) -> NoReturn:
    """End a forked rank as forked children end (multiprocessing's, a DataLoader's): the exit handlers run and the
    output is flushed, but the interpreter's teardown of torch's modules (1.6 s of CPU) is skipped."""
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def serve(modules: list[str]) -> int:
    """The zygote's loop: fork a rank per request on stdin, report each one's exit on stdout. Returns when stdin
    closes (the launcher is gone), its ranks killed first."""
    requests, replies = sys.stdin.buffer, os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what loading prints goes to stderr, not into the replies
    _preload(modules)
    children: set[int] = set()

    def say(message: dict[str, Any]) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # no child could use CUDA
        say({"ready": False, "error": "CUDA was initialised while loading"})
        return 1
    say({"ready": True})
    pending = b""
    while True:
        readable, _, _ = select.select([requests], [], [], 0.05)
        if readable:
            data = os.read(requests.fileno(), 1 << 16)
            if not data:  # the launcher is gone: so are its ranks
                for pid in children:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                return 0
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                request = json.loads(line)
                led, leading = os.pipe()  # closed by the child once it leads its session: a kill can reach it
                try:
                    pid = os.fork()
                except OSError as exc:
                    os.close(led)
                    os.close(leading)
                    say({"id": request["id"], "error": f"fork failed: {exc}"})
                    continue
                if pid == 0:  # stdin, stdout and stderr are replaced in _child
                    os.close(replies.fileno())  # the launcher sees the zygote's end, not a rank's
                    os.close(led)
                    os.setsid()
                    os.close(leading)
                    try:
                        code = _child(request)
                    except BaseException:  # setting up failed (no folder, no file): never back into the loop
                        traceback.print_exc()
                        code = 1
                    _exit(code)
                os.close(leading)
                os.read(led, 1)  # EOF: the child is in its own session (or already gone)
                os.close(led)
                children.add(pid)
                say({"id": request["id"], "pid": pid})
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            children.discard(pid)
            say({"pid": pid, "exit": os.waitstatus_to_exitcode(status)})


# --- the launcher's side --------------------------------------------------------------------------------------

class ZygoteGone(RuntimeError):
    """The zygote exited or stopped answering."""


class Zygote:
    """A started zygote: `fork` a rank of a preloaded program, `forkable` says when a rank may be forked."""

    def __init__(self, modules: Iterable[str], *, env: Mapping[str, str] | None = None,
                 lazy_env: Iterable[str] = ()) -> None:
        self.modules = tuple(modules)
        self.env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
        self.lazy_env = LAZY_ENV | frozenset(lazy_env)
        self._replies: dict[int, dict[str, Any]] = {}
        self.exits: dict[int, int] = {}  # pid -> exit code of each forked rank that ended
        self._changed = threading.Condition()
        self._next_id = 0
        self._proc = subprocess.Popen([sys.executable, "-m", "detlab.worker.zygote", *self.modules],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env)
        assert self._proc.stdout is not None and self._proc.stdin is not None
        self._stdin: IO[bytes] = self._proc.stdin
        self._ready = threading.Event()
        self._loaded, self._problem = False, None
        threading.Thread(target=self._read, args=(self._proc.stdout,), name="detlab-zygote", daemon=True).start()
        if not self._ready.wait(READY_TIMEOUT_S) or not self._loaded:
            self.close()
            raise ZygoteGone(f"the zygote did not load: {self._problem or 'exited or took too long'}")

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            message = json.loads(line)
            with self._changed:
                if "ready" in message:
                    self._loaded, self._problem = message["ready"] is True, message.get("error")
                    self._ready.set()
                elif "exit" in message:
                    self.exits[message["pid"]] = message["exit"]
                else:
                    self._replies[message["id"]] = message
                self._changed.notify_all()
        with self._changed:
            self._ready.set()  # the zygote is gone: a start still waiting sees it at once
            self._changed.notify_all()

    def alive(self) -> bool:
        return self._proc.poll() is None

    def forkable(self, module: str, env: Mapping[str, str]) -> bool:
        """Whether a rank of `module` with `env` would run as a fresh process would: the module was preloaded,
        and `env` differs from the zygote's only in variables read after start-up."""
        return module in self.modules and self.alive() and only_lazy_differences(self.env, env, self.lazy_env)

    def fork(self, module: str, argv: list[str], env: Mapping[str, str], cwd: str, out: str) -> Forked:
        with self._changed:
            self._next_id += 1
            rid = self._next_id
            try:
                self._stdin.write((json.dumps({"id": rid, "module": module, "argv": argv, "env": dict(env),
                                               "cwd": cwd, "out": out}) + "\n").encode())
                self._stdin.flush()
            except (BrokenPipeError, ValueError) as exc:
                raise ZygoteGone(f"the zygote is gone: {exc}") from exc
            while rid not in self._replies:
                if not self.alive():
                    raise ZygoteGone("the zygote exited")
                self._changed.wait(0.5)
            reply = self._replies.pop(rid)
        if "error" in reply:
            raise ZygoteGone(reply["error"])
        return Forked(self, reply["pid"])

    def returncode(self, pid: int) -> int | None:
        with self._changed:
            if pid in self.exits:
                return self.exits[pid]
            if not self.alive():  # its ranks died with it (PR_SET_PDEATHSIG)
                return -signal.SIGKILL
            return None

    def close(self) -> None:
        """Stop the zygote: its ranks are killed."""
        try:
            self._stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class Forked:
    """A forked rank, as the launcher uses a subprocess.Popen: pid, poll(), wait()."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote, self.pid = zygote, pid

    def poll(self) -> int | None:
        return self.zygote.returncode(self.pid)

    def wait(self) -> int:
        while (code := self.poll()) is None:
            time.sleep(0.02)
        return code


_shared: Zygote | None = None
_shared_failed = False
_shared_lock = threading.Lock()


def shared(modules: tuple[str, ...]) -> Zygote | None:
    """This process's zygote for `modules`, started on first use (None: forking is off, or the zygote could not
    start; ranks are then started as fresh processes). A zygote that died, or whose environment differs from this
    process's in more than `LAZY_ENV`, is replaced."""
    global _shared, _shared_failed
    if os.environ.get("DETLAB_FORK_RANKS") == "0":
        return None
    with _shared_lock:
        current = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if _shared is not None and (not _shared.alive() or _shared.modules != modules
                                    or not only_lazy_differences(_shared.env, current)):
            _shared.close()
            _shared = None
        if _shared is None and not _shared_failed:
            try:
                _shared = Zygote(modules)
            except (OSError, ZygoteGone) as exc:
                log.warning("ranks start as fresh processes: %s", exc)
                _shared_failed = True
        return _shared


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:]))
