"""Dependencies injected into the routers."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request
from sqlalchemy.orm import Session

from detlab.backend.db import get_session
from detlab.core.settings import Settings, get_settings

SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]


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
    return user[:64]


CurrentUser = Annotated[str | None, Depends(current_user)]
