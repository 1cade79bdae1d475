"""The registry of job kinds: each kind's module, and the request body of POST /jobs (a union on `kind`).

A new kind is one module here (and one page view): its Kind in KINDS, its request model in JobRequests."""

from __future__ import annotations

from typing import Annotated, Any, TypeAlias

from pydantic import Discriminator, RootModel, model_validator

from detlab.backend.kinds import batch_invariance, bisect, collective, fix, op_audit, recording, resume, sweep, train
from detlab.backend.kinds.base import Kind

KINDS: dict[str, Kind] = {k.name: k for k in (train.KIND, collective.KIND, sweep.KIND, batch_invariance.KIND,
                                                 op_audit.KIND, bisect.KIND, recording.KIND, fix.KIND,
                                                 resume.KIND)}

JobRequests: TypeAlias = (train.TrainCreate | collective.CollectiveCreate | sweep.SweepCreate
               | batch_invariance.BatchInvarianceCreate | op_audit.OpAuditCreate | fix.FixCreate
               | resume.ResumeCreate)
AnyJobRequest = Annotated[JobRequests, Discriminator("kind")]


class JobCreate(RootModel[AnyJobRequest]):
    """POST /jobs: one job of a kind (`kind`, default train); each kind takes its own keys and refuses the others.
    A key sent as null is a key not sent."""

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, value: Any) -> Any:
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if v is not None}
            value.setdefault("kind", "train")
        return value


def kind_of(name: str) -> Kind:
    """The kind of a stored job (KeyError for a kind this server does not know)."""
    return KINDS[name]


def submittable() -> list[str]:
    """The kinds POST /jobs takes, in the registry's order."""
    return [name for name, kind in KINDS.items() if kind.request is not None]
