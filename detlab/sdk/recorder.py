"""`detlab.Recorder`: fingerprints of a training loop's tensors, per step and rank, written to a directory
and, in online mode, streamed to a detlab server as they are written (detlab.sdk.upload).

It writes what the built-in training ranks write (detlab.worker.ranks.train): per rank an `env` record, a
`tensors` record and one `step` record per recorded step, so that the same comparison applies. The layout
of the directory is in detlab.sdk.store; how digests are taken without stalling the loop, in
detlab.tensors.digests.
"""

from __future__ import annotations

import atexit
import math
import operator
import os
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import TypeAdapter, ValidationError

from detlab.core.wire import (
    EnvRecord,
    Position,
    PreflightFinding,
    RecordingOpen,
    StepRecord,
    StepState,
    Tags,
    TensorComponent,
    TensorInfo,
    TensorsRecord,
    explain,
)
from detlab.sdk import identity, store, upload
from detlab.sdk.probing import Probing
from detlab.sdk.resume import ABSENT, Resumed, read_resumed
from detlab.sdk.spool import Spool
from detlab.tensors import named as named_tensors
from detlab.tensors import state as train_state
from detlab.tensors.collectives import CallTracer, calls_record
from detlab.tensors.digests import Digester, Pending, read_scalar

if TYPE_CHECKING:
    import torch

    from detlab.sdk.identity import Identity


def loss_bits(value: float | None) -> str:
    """The loss's float32 bits as 8 hex digits, as the built-in ranks record them; "" without a loss."""
    if value is None:
        return ""
    with np.errstate(over="ignore"):
        return f"{int(np.float32(value).view(np.uint32)):08x}"


Sketched = Callable[[], "tuple[bytes, bytes] | None"]

# The default drift cadence: stats and sketches at every 10th step. The comparison estimates drift at no more than
# detlab.core.drift.POINTS sampled steps, so a run of 2,000 steps or more loses no point by it; the loop pays the
# sketch's part of the one-pass read (0.07 ms of 0.26 ms a step for GPT-2 small on an H100) at one step in ten
# (the kernels' times; the loop at this cadence is not yet timed on a GPU).
DRIFT_EVERY = 10


def _drift(state: Sketched | None, grads: Sketched | None) -> dict[str, bytes] | None:
    """The record's drift data (a `Drift`'s fields, as raw bytes): the state's stats and sketches, then the
    gradients' (None where either has none). A gradient's row map is that of its index in the gradients' own list:
    both runs record the same lists. Fields, not a `Drift`: the step record validates them once, where an instance
    would be checked twice (pydantic validates a model instance in a field again: 45 us a GPT-2 step); bytes, not
    text: checked without decoding 45 KB of hex a step."""
    if state is None:
        return None
    found = [state(), *([grads()] if grads is not None else [])]
    if any(f is None for f in found):
        return None
    return {"stats": b"".join(f[0] for f in found if f), "sketch": b"".join(f[1] for f in found if f)}


# CPU lists up to this size are copied at the call and digested on the writer thread; the spool holds at most
# its depth of such copies. Larger ones are digested at the call (no copies of a large model piling up).
SNAPSHOT_BYTES = 1 << 30


def cpu_snapshot(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
    """A copy of a list of CPU tensors (None if any is elsewhere, the list is empty or larger than
    SNAPSHOT_BYTES, or DETLAB_CPU_DEFER=0): same logical bytes, so the same digests and sketches."""
    import torch

    from detlab.tensors.fingerprint.torch_impl import check_supported

    if not tensors or os.environ.get("DETLAB_CPU_DEFER") == "0" or any(t.device.type != "cpu" for t in tensors):
        return None
    for t in tensors:  # a tensor that cannot be hashed is refused at the call, as before, not on the writer
        check_supported(t)
    if sum(t.nbytes for t in tensors) > SNAPSHOT_BYTES:
        return None
    with torch.no_grad():
        return [t.detach().clone() for t in tensors]


def _drain_at_exit(ref: weakref.ReferenceType[Recorder]) -> Callable[[], None]:
    def drain() -> None:
        recorder = ref()
        if recorder is not None:
            recorder._drain()

    return drain


# Where online recordings without out= keep their records: DETLAB_SPOOL_DIR, else the user's cache.
def spool_root() -> Path:
    return Path(os.environ.get("DETLAB_SPOOL_DIR") or Path.home() / ".cache" / "detlab" / "recordings")


_TAGS: TypeAdapter[list[str]] = TypeAdapter(Tags)
_POSITION: TypeAdapter[dict[str, int]] = TypeAdapter(Position)


def position_of(position: Any) -> dict[str, int] | None:
    """A rank's logical position: a dict such as {"dp": 1, "tp": 0}, or a DeviceMesh with mesh_dim_names
    (this rank's coordinate on it); None stays None."""
    if position is None:
        return None
    if hasattr(position, "mesh_dim_names") and hasattr(position, "get_coordinate"):
        names, coordinate = position.mesh_dim_names, position.get_coordinate()
        if not names:
            raise ValueError("position: the DeviceMesh has no mesh_dim_names; make it with "
                             "init_device_mesh(..., mesh_dim_names=(\"dp\", \"tp\"))")
        if coordinate is None:
            raise ValueError("position: this rank is not on the DeviceMesh")
        position = dict(zip(names, coordinate, strict=True))
    try:
        return _POSITION.validate_python(position)
    except ValidationError as exc:
        raise ValueError(f"position: {explain(exc)} (e.g. position={{'dp': 0, 'tp': 1}})") from None


class Recorder:
    """Records fingerprints of a model's tensors at every step, on every rank, into a directory.

    >>> rec = detlab.Recorder(out="runs/a")
    >>> for step in range(steps):
    ...     ...                                  # forward, backward, optimizer.step()
    ...     rec.step(step, model, loss=loss)
    >>> rec.close()

    Each rank (RANK/WORLD_SIZE/LOCAL_RANK from torchrun, or torch.distributed once initialised) writes
    `out/rank<r>.jsonl`; rank 0 writes `out/run.json`. Compare two directories with `detlab compare A B`.

    Online mode: `detlab.Recorder(server="http://host:8000", name=..., tags=[...])` also streams each
    rank's records to that server as they are written (token: `token=` or DETLAB_TOKEN, with scope
    ingest). The directory (out=, else DETLAB_SPOOL_DIR or ~/.cache/detlab/recordings/<id>) is the spool:
    while the server cannot be reached the records wait there and go when it answers again; whatever
    `close()` could not send in `flush_timeout_s` stays there for `detlab upload DIR --server URL`.

    Run by a detlab worker (a script registered with `detlab worker --scripts FILE`), it records where the
    worker reads (DETLAB_RUN_DIR) whatever out= and server= say, every DETLAB_EVERY steps, and applies the
    job's config's torch flags when it is made: make it before the model.

    Options:
      name, tags   stored in run.json (and on the server: tags are 1-32 letters, digits and . _ : = + -).
      every        record steps whose number is a multiple of `every` (`rec.step` is still called at each
                   step; it measures the step time).
      names        which tensors: glob pattern(s) on the recorded names, or a function of the name.
      buffers      also the model's buffers (BatchNorm running statistics, ...).
      optimizer    also this optimizer's per-parameter state (`fc1.weight.exp_avg`, ...), its param groups'
                   hyperparameters (`param_groups[0].lr`: an LR scheduler that restarted shows here) and the
                   state it keeps as numbers.
      rng          True: also the states of the default random generators after each recorded step (torch CPU,
                   each CUDA device once CUDA is initialised, numpy's global, Python's `random`); a list (or a
                   dict by name) of torch / numpy / `random.Random` generators: those too.
      resume       continue the recording already in `out` after restoring a checkpoint in a new process: the
                   first recorded `rec.step(K, model)` at or before its last recorded step re-records step K from
                   the restored state (call it right after loading the checkpoint, before training on); both
                   records of step K are kept and `detlab compare` says whether the restore matched.
      grads        also the gradients the optimizer step consumes (`fc1.weight.grad`): call
                   `rec.grads(step, model)` after `loss.backward()` and before `optimizer.step()`.
      drift        also per-tensor statistics (float64 sum, L2 norm, max |x|) and a 16-number sketch of every
                   recorded tensor (detlab.core.sketch) at the recorded steps whose number is a multiple of
                   `drift` (default DRIFT_EVERY = 10; True or 1: every recorded step; False or 0: none): the
                   comparison then estimates how far the runs drift apart (‖A−B‖/‖A‖) at the steps both
                   sketched. The other steps cost one read of the tensors, the digests' alone.
      overwrite    replace a recording already in `out` instead of refusing to start.
      collectives  also fingerprint every collective call's input and output (detlab.tensors.collectives): the
                   torch.distributed functions are wrapped from now until `close()`; for DDP call
                   `rec.hook_ddp(ddp_model)` before training. A step's calls are those made since the previous
                   `rec.step`; `detlab compare` names the first call whose output differs and whether its
                   inputs matched (then the reduction order or topology made the difference). With every > 1
                   the calls of every step are fingerprinted, those of recorded steps kept.
      position     this rank's logical position, {"dp": i, "tp": j, "pp": k, "cp": l}, or a DeviceMesh with
                   mesh_dim_names: runs whose ranks are numbered otherwise are compared position by position.
    """

    def __init__(self, out: str | os.PathLike[str] | None = None, *, server: str | None = None,
                 token: str | None = None, name: str | None = None, tags: Sequence[str] = (), every: int = 1,
                 names: named_tensors.NameFilter = None, grads: bool = False,
                 optimizer: torch.optim.Optimizer | None = None, buffers: bool = False, drift: int = DRIFT_EVERY,
                 overwrite: bool = False, flush_timeout_s: float = 60.0, collectives: bool = False,
                 position: Any = None, rng: train_state.Generators = False, resume: bool = False) -> None:
        server = server or None
        self._probing: Probing | None = None
        if run_dir := os.environ.get("DETLAB_RUN_DIR"):
            # Run by a detlab worker as a registered script: it reads the records where it says and streams
            # them itself, every as many steps as the job asks, under the config's torch flags.
            out, server = run_dir, None
            every = int(os.environ.get("DETLAB_EVERY", every))
            # A resume job's second launch continues the first's recording (detlab.worker.runner.phases).
            resume = resume or os.environ.get("DETLAB_RESUME") == "1"
            if probe_step := os.environ.get("DETLAB_PROBE_STEP"):  # a bisect of this script (detlab.sdk.probing)
                self._probing, every = Probing(int(probe_step)), 1
            if flags := os.environ.get("DETLAB_TORCH_FLAGS"):
                from detlab.core.configs import TorchFlags
                from detlab.tensors.stack import apply_torch_flags

                apply_torch_flags(TorchFlags.model_validate_json(flags))
        if server is not None and not server.startswith(("http://", "https://")):
            raise ValueError(f"server must be the detlab server's URL, e.g. http://host:8000, got {server!r}")
        if out is None and server is None:
            raise TypeError("detlab.Recorder needs out=DIR, the directory to write the records to (or server=URL)")
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"every must be a whole number of steps >= 1, got {every!r}")
        if not isinstance(drift, int) or drift < 0:
            raise ValueError(f"drift takes True, False or a whole number of steps >= 0, got {drift!r}")
        if run_dir and drift:
            drift = 1  # a job's runs are short: its pages show drift at every recorded step
        if isinstance(tags, str):
            raise TypeError("tags takes a list of strings, e.g. tags=['ci']")
        try:
            _TAGS.validate_python(list(tags))
        except ValidationError as exc:
            raise ValueError(f"tags: {explain(exc)}") from None
        if name is not None and len(name) > 255:
            raise ValueError("name is at most 255 characters")
        self._position = position_of(position)
        import torch  # the SDK's one heavy import, here rather than at `import detlab`

        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if not isinstance(rng, (bool, list, tuple, dict)):
            raise TypeError("rng takes True, or a list (or a dict by name) of torch / numpy / random generators")
        self._rng_defaults, self._rng_named = rng is True, train_state.named_generators(rng)
        self._rng = bool(rng)
        if resume and overwrite:
            raise ValueError("resume=True continues the recording in `out`, overwrite=True replaces it: pass one")
        if resume and out is None:
            raise ValueError("resume=True needs out=DIR, the directory of the recording to continue")
        if resume and server is not None:
            # The server closes a recording when its ranks close; it does not reopen one for a second process yet.
            raise ValueError("resume=True records to out= only, not online: drop server= and, once the run is done, "
                             "send the whole recording with `detlab upload DIR --server URL`")
        self.out: Path | None = Path(out) if out is not None else None  # online without out: set at the start
        self.server, self._token, self._flush_timeout_s = server, token, flush_timeout_s
        self._streamer: upload.Streamer | None = None
        self.name, self.tags, self.every = name, list(tags), every
        self._keep = named_tensors.name_filter(names)
        self._grads, self._buffers, self._optimizer = grads, buffers, optimizer
        self._overwrite = overwrite
        self._digester = Digester()
        self._sketcher: Any = None
        self._onepass: Any = None
        self._drift_every = int(drift)
        if drift:
            from detlab.tensors.drift import Sketcher
            from detlab.tensors.onepass import OnePassQueue

            self._sketcher = Sketcher()
            self._onepass = OnePassQueue()  # digests and drift from one read, where it serves the list
        self._who: Identity | None = None
        self._spool: Spool | None = None
        self._manifest: store.Manifest | None = None
        self._model: named_tensors.ModelTensors | None = None
        self._kept: dict[str, bool] = {}  # the name filter's answers (asked once per name)
        self._tensors: list[tuple[str, list[int], str]] | None = None
        # _state's last answer: the lists it was made from, the state, its components, its tensors (None where
        # a DTensor is among them); and the state last checked whole with its ListKey (see `step`).
        self._listed: tuple[tuple[named_tensors.Named, ...], named_tensors.Named, list[TensorComponent],
                            list[torch.Tensor] | None] | None = None
        self._steady: tuple[named_tensors.Named, named_tensors.ListKey] | None = None
        self._fixed: tuple[list[str], list[tuple[object, object]]] | None = None  # names, layout of the first step
        self._grad_pending: tuple[int, named_tensors.Named, Pending, Sketched | None] | None = None
        self._last_step: int | None = None
        self._last_call: float | None = None
        self._closed = False
        self._tracer: CallTracer | None = None
        # resume=True: what the recording in `out` holds of this rank (detlab.sdk.resume); its first recorded step
        # here is the restored state, if at or before the last step recorded.
        self._resumed: Resumed | None = None
        self._restoring = False
        if self.out is not None:
            if resume:
                self._resumed = read_resumed(self.out, identity.current().rank)
            elif not overwrite:  # said now, not at the first rec.step after the model was built
                self._refuse_existing(store.rank_path(self.out, identity.current().rank))
            self.out.mkdir(parents=True, exist_ok=True)
        # Records already handed to the writer reach the file even if the script never calls close().
        self._atexit = _drain_at_exit(weakref.ref(self))
        atexit.register(self._atexit)
        if collectives:  # last: nothing after it can fail and leave torch.distributed patched
            self._tracer = CallTracer()
            self._tracer.install()

    # ---- the loop's calls ---------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        """This process's rank (known from the first recorded step on; the launcher's RANK before)."""
        return (self._who or identity.from_env()).rank

    @property
    def world_size(self) -> int:
        """The run's world size (known from the first recorded step on; the launcher's WORLD_SIZE before)."""
        return (self._who or identity.from_env()).world_size

    def records(self, step: int) -> bool:
        """Whether `step` is one that this recorder records (a multiple of `every`)."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be a whole number >= 0, got {step!r}")
        return step % self.every == 0

    def grads(self, step: int, model: torch.nn.Module) -> None:
        """Fingerprint the gradients of `step`: call after `loss.backward()` and before `optimizer.step()`
        (the gradients the step consumes; the optimizer may change them, and zero_grad drops them). The
        digests are queued now and written with `rec.step(step, ...)`. Needs `grads=True`."""
        self._check_open()
        if not self._grads:
            raise ValueError("rec.grads() needs detlab.Recorder(..., grads=True)")
        if not self.records(step):
            return
        self._begin(model)
        found, lacking = self._tensors_of(model).gradients()
        if lacking and not found:
            raise ValueError(f"rec.grads({step}, model): no parameter has a gradient; call it after "
                             "loss.backward() and before optimizer.step() / zero_grad()")
        kept = self._filter(found)
        self._grad_pending = (step, kept, *self._queue([t for _, t in kept], drift=self._drifts(step)))

    def hook_ddp(self, model: torch.nn.Module) -> None:
        """Record the allreduce of every gradient bucket of a DistributedDataParallel model (its reducer calls
        the process group from C++, out of reach of the wrapped functions): call once, before training.
        Needs `collectives=True`; it registers a DDP communication hook (a model takes one)."""
        self._check_open()
        if self._tracer is None:
            raise ValueError("rec.hook_ddp() needs detlab.Recorder(..., collectives=True)")
        self._tracer.hook_ddp(model)

    def step(self, step: int, model: torch.nn.Module, *, loss: Any = None, batch: Any = None) -> None:
        """Record the state after `step`: call after `optimizer.step()`. `loss`: a scalar tensor or number
        (recorded by its float32 bits), or None. `batch`: the step's input, a tensor or a dict / list / tuple of
        them (nested), fingerprinted: two runs that read their data in another order differ here first. Steps
        must increase; those not a multiple of `every` are only timed. Digests are computed on the tensors'
        device and written in the background.

        With resume=True, the first recorded call at a step at or before the recording's last one records the
        restored state of that step (call it after loading the checkpoint, without training: no loss, batch or
        gradients); the steps after it continue the recording."""
        self._check_open()
        now = time.perf_counter()
        seconds = now - self._last_call if self._last_call is not None else 0.0
        self._last_call = now
        calls = self._tracer.take() if self._tracer is not None else []
        if not self.records(step):
            return
        self._restoring = False
        if self._resumed is not None and self._last_step is None:
            self._restoring = step <= self._resumed.last_step
        if self._last_step is not None and step <= self._last_step:
            self._finish("failed")  # the script dies here: the recording says so, never `running`
            raise ValueError(
                f"rec.step({step}) after step {self._last_step}: step numbers must increase over the whole run; "
                "pass a global step counter (e.g. `global_step += 1` at every step, or "
                "epoch * len(loader) + batch_idx), not the batch index within an epoch. The recording is "
                "closed as failed; record into a new directory")
        self._begin(model)
        assert self._spool is not None and self._who is not None
        if self._probing is not None:
            self._probing.step(step=step, model=model, loss=loss, seconds=seconds, rank=self._who.rank,
                               put=self._spool.put, digester=self._digester, loss_bits=loss_bits)
            self._last_step = step
            return
        state, components = self._state(model)
        assert self._listed is not None
        plain = self._listed[3]
        # The per-step host work, built once: a state list checked at an earlier step, whose ListKey is the same
        # now (the same tensors at the same addresses, shapes, strides, dtypes), is neither checked again nor
        # planned again (the stored key's plans are found by identity).
        key = named_tensors.ListKey(plain) if plain is not None else None
        if key is not None and self._steady is not None and self._steady[0] is state and self._steady[1] == key:
            key, steady = self._steady[1], True
        else:
            steady = False
        recorded = state
        grad_digests = None
        grad_sketch = None
        absent: list[int] | None = None  # a restored record: where its tensors sit in the recording's list
        try:
            if self._grads and not self._restoring:
                pending = self._grad_pending
                if pending is None or pending[0] != step:
                    raise ValueError(f"grads=True but step {step} has no gradients: call rec.grads({step}, model) "
                                     "after loss.backward() and before optimizer.step()")
                recorded = state + pending[1]
                components = components + ["gradients"] * len(pending[1])
                grad_digests, grad_sketch = pending[2], pending[3]
                self._grad_pending = None
            if self._restoring:
                absent = self._restored_slots(step, recorded)
            elif not steady or recorded is not state:  # with gradients the list is checked whole
                self._check_tensors(step, recorded, components)
                if recorded is state and key is not None:
                    self._steady = (state, key)
        except ValueError:
            self._finish("failed")  # as for a step out of order: never left `running`
            raise
        # Queued on the device now, read on the writer thread: the loop never waits for them.
        digests, sketched = self._queue(plain if plain is not None else [t for _, t in state], key,
                                        drift=self._drifts(step))
        if absent is not None:
            sketched = None  # a restore's record has no drift: the state it restored is compared, not its motion
        read_batch = train_state.submit_batch(batch, self._digester) if batch is not None else None
        rngs = train_state.rng_states(self._rng_named, defaults=self._rng_defaults) if self._rng else None
        hyper = (train_state.optimizer_entries(self._optimizer, {id(p): n for n, p in
                                                                 self._tensors_of(model).parameters()})
                 if self._optimizer is not None else None)
        read_loss = read_scalar(loss)
        rank, restored = self._who.rank, self._restoring
        segment = self._resumed.segment if self._resumed is not None else 0
        slots = len(self._tensors or ())

        def record() -> StepRecord:
            from detlab.tensors import fingerprint as fp

            packed = digests.packed() + (grad_digests.packed() if grad_digests is not None else b"")
            if absent is not None:  # the restored state lacks some of the list (gradients, lost optimizer state)
                placed = [ABSENT] * slots
                for i, digest in zip(absent, fp.split_packed(packed), strict=True):
                    placed[i] = digest
                packed = b"".join(placed)
            value = read_loss()
            extra = (StepState(batch=read_batch() if read_batch is not None else None, rng=rngs, optimizer=hyper)
                     if read_batch is not None or rngs is not None or hyper is not None else None)
            return StepRecord.model_validate({
                "step": step, "rank": rank, "fp_version": fp.FP_VERSION, "model_digest": fp.fingerprint_bytes(packed),
                "digests": packed.hex(), "loss_bits": loss_bits(value),
                "loss": value if value is not None and math.isfinite(value) else None,
                "step_time_s": max(seconds, 0.0), "drift": _drift(sketched, grad_sketch),
                "state": extra if extra is not None and extra != StepState() else None, "segment": segment,
                "restored": restored})

        self._spool.put(record)
        if calls:
            self._spool.put(lambda: calls_record(step, rank, calls))
        self._last_step = step

    def close(self) -> None:
        """Write every queued record and mark the run finished (rank 0). Idempotent."""
        self._finish("finished")

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._finish("finished" if kind is None else "failed")

    # ---- internals ----------------------------------------------------------------------------------

    def _drifts(self, step: int) -> bool:
        """Whether `step`'s record carries drift data (stats and sketches): a multiple of the `drift` option."""
        return self._drift_every > 0 and step % self._drift_every == 0

    def _queue(self, tensors: list[torch.Tensor], key: named_tensors.ListKey | None = None, *,
               drift: bool) -> tuple[Pending, Sketched | None]:
        """Queue the digests and (with `drift`) the stats and sketches of `tensors` (with `key`: their ListKey, and
        no DTensor among them): on one CUDA device from one read of each element (detlab.tensors.onepass); on the
        CPU from a snapshot, on the writer thread; else in two passes at the call."""
        if key is None:  # a list with no ListKey may hold what no fingerprint reads: refused here, on any device
            from detlab.tensors.fingerprint.torch_impl import check_supported

            tensors = named_tensors.local(tensors)
            for t in tensors:
                check_supported(t)
        sketcher = self._sketcher if drift else None
        if drift and (both := self._onepass.submit(tensors, key)) is not None:  # drift: a recorder that sketches
            return both
        if (snapshot := cpu_snapshot(tensors)) is not None:
            # The loop pays one copy; the writer thread hashes and sketches the copy, which nothing changes.
            from detlab.tensors import fingerprint as fp

            digests = Pending(len(snapshot))
            digests.add(list(range(len(snapshot))), lambda: fp.digests_to_bytes(fp.fingerprint_many(snapshot)))
            return digests, sketcher.submit(snapshot, defer_cpu=True) if sketcher else None
        sketched = sketcher.submit(tensors) if sketcher else None
        return self._digester.submit(tensors, key), sketched

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this detlab.Recorder is closed; make a new one for another run")
        if self._spool is not None:
            self._spool.check()

    def _tensors_of(self, model: torch.nn.Module) -> named_tensors.ModelTensors:
        if self._model is None or self._model.model is not model:
            self._model = named_tensors.ModelTensors(model)
        return self._model

    def _filter(self, named: named_tensors.Named) -> named_tensors.Named:
        kept = self._kept
        for n, _ in named:
            if n not in kept:
                kept[n] = bool(self._keep(n))
        return [(n, t) for n, t in named if kept[n]]

    def _state(self, model: torch.nn.Module) -> tuple[named_tensors.Named, list[TensorComponent]]:
        """The tensors a step records (gradients aside) and the component of each: the same list objects as at the
        last call while the lists they come from are (ModelTensors keeps its lists while the model is unchanged;
        the optimizer's state is listed anew at every call)."""
        import torch

        found = self._tensors_of(model)
        parts: list[tuple[TensorComponent, named_tensors.Named]] = [("parameters", found.parameters())]
        if self._buffers:
            parts.append(("buffers", found.buffers()))
        if self._optimizer is not None:
            parts.append(("optimizer", found.optimizer_state(self._optimizer)))
        lists = tuple(named for _, named in parts)
        if self._listed is None or len(lists) != len(self._listed[0]) or not all(map(operator.is_, lists,
                                                                                       self._listed[0])):
            kept = [(c, self._filter(named)) for c, named in parts]
            state = [t for _, named in kept for t in named]
            tensors = [t for _, t in state]
            dtensor = named_tensors.dtensor_type()
            # A ListKey reads data pointers: plain strided tensors only (others go the way they went before it).
            plain = tensors if all(t.layout == torch.strided and (dtensor is None or not isinstance(t, dtensor))
                                   for t in tensors) else None
            self._listed = (lists, state, [c for c, named in kept for _ in named], plain)
        return self._listed[1], self._listed[2]

    def _restored_slots(self, step: int, recorded: named_tensors.Named) -> list[int]:
        """Where each tensor of a restored step sits in the recording's list: the restored state may lack some
        (no gradients before a backward; optimizer state that was not restored), never hold others."""
        assert self._tensors is not None
        index = {n: i for i, (n, _, _) in enumerate(self._tensors)}
        described = named_tensors.describe(recorded)
        stray = [n for n, _, _ in described if n not in index]
        changed = [n for n, s, d in described if n in index and self._tensors[index[n]][1:] != (s, d)]
        if stray or changed:
            raise ValueError(f"rec.step({step}) after resume: the restored state holds tensors the recording does not "
                             f"(new: {stray[:5]}, other shape or dtype: {changed[:5]}); continue a recording of the "
                             "same model, optimizer and names=")
        return [index[n] for n, _, _ in described]

    def _check_tensors(self, step: int, recorded: named_tensors.Named, components: list[TensorComponent]) -> None:
        """The first recorded step fixes the tensor list (the order of every step's digests)."""
        names, layout = [n for n, _ in recorded], named_tensors.layout(recorded)
        if self._fixed is not None and self._fixed[0] == names and self._fixed[1] == layout:
            return
        described = named_tensors.describe(recorded)
        if self._tensors is not None and self._fixed is None and described == self._tensors:
            self._fixed = (names, layout)  # resumed: the list is the recording's, as its tensors record says
            return
        if self._tensors is None:
            if not described:
                raise ValueError("no tensor to record: names= matched none of the model's tensors")
            self._tensors, self._fixed = described, (names, layout)
            infos = [TensorInfo(index=i, name=n, shape=s, dtype=d, component=c)
                     for i, ((n, s, d), c) in enumerate(zip(described, components, strict=True))]
            record = TensorsRecord(tensors=infos, layouts=named_tensors.layouts(recorded, self._model))
            assert self._spool is not None
            self._spool.put(lambda: record)
            return
        before, now = {t[0]: t for t in self._tensors}, {t[0]: t for t in described}
        gone, new = sorted(before.keys() - now.keys()), sorted(now.keys() - before.keys())
        changed = sorted(n for n in before.keys() & now.keys() if before[n] != now[n])
        raise ValueError(f"the recorded tensors changed at step {step} (missing: {gone[:5]}, new: {new[:5]}, "
                         f"other shape or dtype: {changed[:5]}); every step must record the tensors of the "
                         "first recorded one (optimizer state appears at the first optimizer.step(): record "
                         "after it)")

    def _begin(self, model: torch.nn.Module) -> None:
        """At the first recorded call: who this process is, its file, its env record, the manifest."""
        if self._spool is not None:
            return
        import torch

        from detlab.tensors import fingerprint as fp

        who = identity.current()
        recording = (upload.shared_recording_id(who.rank, who.world_size) if self.server
                     else upload.new_recording_id())
        if self.out is None:
            self.out = spool_root() / recording
            self.out.mkdir(parents=True, exist_ok=True)
        path = store.rank_path(self.out, who.rank)
        if self._resumed is not None:
            self._begin_resumed(who, path)
            return
        try:
            self._spool = Spool(path, overwrite=self._overwrite)
        except FileExistsError:
            self._refuse_existing(path)
            raise
        self._who = who
        if who.rank == 0:
            if self._overwrite:
                for rank, stale in store.rank_files(self.out).items():
                    if rank >= who.world_size:
                        stale.unlink(missing_ok=True)
            self._manifest = store.Manifest(id=recording, name=self.name, tags=self.tags, world_size=who.world_size,
                                            fp_version=fp.FP_VERSION, every=self.every, started=store.now())
            store.write_manifest(self.out, self._manifest)
        first = next(iter(self._tensors_of(model).parameters()), (None, None))[1]
        device = first.device if first is not None else torch.device("cpu")
        backend = identity.backend()
        position = self._position
        found = self._preflight(device, backend)
        self._spool.put(lambda: self._env_record(who, device, backend, found).model_copy(
            update={"position": position}))
        if self.server:
            opening = RecordingOpen(recording=recording, name=self.name, tags=self.tags, world_size=who.world_size)
            self._streamer = upload.Streamer(self.server, self._token, opening, path, who.rank)

    def _begin_resumed(self, who: Identity, path: Path) -> None:
        """resume=True: append to this rank's file of the recording (its env and tensors records are there)."""
        assert self._resumed is not None and self.out is not None
        manifest = self._resumed.manifest
        if manifest.world_size != who.world_size:
            raise ValueError(f"resume=True: {self.out} is a recording of world size {manifest.world_size}, this run "
                             f"has {who.world_size}; continue it with as many ranks")
        self._tensors = self._resumed.tensors
        self._spool = Spool(path, append=True)
        self._who = who
        if who.rank == 0:
            self._manifest = manifest.model_copy(update={"status": "running", "finished": None})
            store.write_manifest(self.out, self._manifest)

    def _refuse_existing(self, path: Path) -> None:
        if path.exists():
            raise FileExistsError(f"{path} exists: {self.out} already holds a recording; record into a new "
                                  "directory, delete this one, or pass overwrite=True") from None

    @staticmethod
    def _preflight(device: torch.device, backend: str | None) -> list[PreflightFinding]:
        """The preflight table against this process's settings at the start of the recording: each finding is
        warned (once) and recorded in the rank's env record; it never stops the user's training."""
        from detlab.tensors.stack import preflight_findings

        found = preflight_findings(device, backend)
        for f in found:
            warnings.warn(f"detlab preflight ({f.rule}): {f.matched}: {f.reason}. Fix: {f.fix} (source: {f.source})",
                          RuntimeWarning, stacklevel=4)
        return found

    @staticmethod
    def _env_record(who: Identity, device: torch.device, backend: str | None,
                    found: list[PreflightFinding]) -> EnvRecord:
        # Runs on the writer thread: nvidia-smi stays off the loop.
        from detlab.tensors.stack import env_record

        record = env_record(who.rank, device, backend or "", found)
        return record.model_copy(update={"backend": backend})  # None: no process group

    def _drain(self) -> None:
        if self._spool is not None and not self._closed:
            try:
                self._spool.close()
            except RuntimeError:
                pass  # at interpreter exit there is no one left to tell

    def _finish(self, status: Literal["finished", "failed"]) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._atexit)
        if self._tracer is not None:
            self._tracer.uninstall()
        if self._spool is None:
            return
        try:
            self._spool.close()
        finally:
            if self._manifest is not None:
                assert self.out is not None
                self._manifest = self._manifest.model_copy(update={"status": status, "finished": store.now()})
                store.write_manifest(self.out, self._manifest)
            self._send_rest(status)

    def _send_rest(self, status: Literal["finished", "failed"]) -> None:
        """Online: give the streamer `flush_timeout_s` to send what is left and close this rank; never raise
        for the network (the records are safe in the directory), but say what to do."""
        if self._streamer is None:
            return
        closed = self._streamer.finish("succeeded" if status == "finished" else "failed",
                                       "closed by an exception" if status == "failed" else None,
                                       self._flush_timeout_s)
        if not closed:
            why = self._streamer.problem or f"{self.server} did not take them within {self._flush_timeout_s:g} s"
            warnings.warn(f"detlab: rank {self.rank}'s records are not all on the server ({why}); they are kept in "
                          f"{self.out}: send them with `detlab upload {self.out} --server {self.server}`",
                          RuntimeWarning, stacklevel=3)
