"""Dependencies injected into the routers."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Path, Query, Request
from sqlalchemy.orm import Session

from detlab.backend.db import get_session
from detlab.core.settings import Settings, get_settings
from detlab.core.text import text_error
from detlab.core.wire import INT32, INT64, MAX_WORLD_SIZE

SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]

# Path and query integers bounded to the columns they are compared with: a value no row can have is a 422
# naming the parameter, never a database overflow (a 500 on PostgreSQL past 2^31, on SQLite past 2^63).
JobId = Annotated[int, Path(ge=1, le=INT32, description="a job's id")]
RunId = Annotated[int, Path(ge=1, le=INT32, description="a run's id")]
RankPath = Annotated[int, Path(ge=0, lt=MAX_WORLD_SIZE, description="a rank of the run")]
Limit = Annotated[int, Query(ge=1, le=200)]
Offset = Annotated[int, Query(ge=0, le=INT64)]


def require_ingest_token(settings: SettingsDep, authorization: Annotated[str | None, Header()] = None) -> None:
    expected = settings.resolved_ingest_token()
    given = (authorization or "").removeprefix("Bearer ").strip()
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise HTTPException(401, "ingest needs 'Authorization: Bearer <DETLAB_INGEST_TOKEN>'")


IngestAuth = Depends(require_ingest_token)


def current_user(settings: SettingsDep, request: Request) -> str | None:
    """The submitting user: None without auth; the proxy's header in proxy mode (required)."""
    if settings.auth_mode == "none":
        return None
    user = request.headers.get(settings.proxy_user_header, "").strip()
    if not user:
        raise HTTPException(401, f"auth mode 'proxy': the request lacks the {settings.proxy_user_header} header")
    if problem := text_error(user):  # it is stored as the job's submitter
        raise HTTPException(400, f"the {settings.proxy_user_header} header {problem}")
    return user[:64]


CurrentUser = Annotated[str | None, Depends(current_user)]
