"""A validated model sent as JSON bytes, serialised once.

A plain (sync) route that returns a model has FastAPI validate it again against its response_model, in the
thread pool, and serialise it: on a page polled by many readers that is a second validation and a second
hand-off per request. The routes keep their response_model for the schema; the model is validated once."""

from __future__ import annotations

from fastapi import Response
from pydantic import BaseModel


def json_response(model: BaseModel) -> Response:
    return Response(model.model_dump_json().encode(), media_type="application/json")
