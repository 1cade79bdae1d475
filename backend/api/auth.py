"""Browser login and logout (auth mode `local`), and who the caller is."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from pydantic import BaseModel, Field

from detlab.backend.api.deps import SESSION_COOKIE, SessionDep, SettingsDep, forwarded_https, require
from detlab.backend.services import auth
from detlab.backend.services.auth import Identity
from detlab.backend.services.login_limit import Busy, LoginLimiter
from detlab.core.text import StorableText

router = APIRouter(prefix="/api/v1/auth", tags=["auth"])


class LoginCreate(BaseModel):
    name: StorableText = Field(min_length=1, max_length=64)
    password: StorableText = Field(min_length=1, max_length=1024)


class IdentityRead(BaseModel):
    """The caller: no name in auth mode none."""

    auth_mode: Literal["none", "proxy", "local"]
    name: str | None
    scopes: list[auth.Scope]


def _read(settings: SettingsDep, found: Identity | None) -> IdentityRead:
    return IdentityRead(auth_mode=settings.auth_mode, name=found.name if found else None,
                        scopes=sorted(found.scopes) if found else [])  # type: ignore[arg-type]


@router.post("/login", response_model=IdentityRead, responses={401: {"description": "wrong user name or password"},
                                                                409: {"description": "auth mode is not 'local'"},
                                                                429: {"description": "too many wrong logins"},
                                                                503: {"description": "too many logins at once"}})
def login(data: LoginCreate, request: Request, response: Response, session: SessionDep,
          settings: SettingsDep) -> IdentityRead:
    """Check the password and set the session cookie (HttpOnly, SameSite=Lax, Secure over https, also when a
    trusted proxy says so in X-Forwarded-Proto, or as DETLAB_SESSION_COOKIE_SECURE says). Wrong logins per
    user and per address are limited (429), and so are password hashes at once (503)."""
    if settings.auth_mode != "local":
        raise HTTPException(409, f"auth mode is '{settings.auth_mode}': there is nothing to log in to")
    limiter: LoginLimiter = request.app.state.login_limiter
    address = request.client.host if request.client else ""
    if (wait := limiter.retry_after(account=data.name, address=address)) is not None:
        raise HTTPException(429, f"too many wrong logins for this user or from this address; try again in "
                                 f"{math.ceil(wait)} s", headers={"Retry-After": str(math.ceil(wait))})
    try:
        with limiter.hashing():
            cookie, _ = auth.login(session=session, name=data.name, password=data.password,
                                   ttl_s=settings.session_ttl_s)
    except Busy as exc:
        raise HTTPException(503, "too many logins at once; try again in a moment",
                            headers={"Retry-After": "1"}) from exc
    except auth.AuthError as exc:
        limiter.failed(account=data.name, address=address)
        raise HTTPException(401, str(exc)) from exc
    limiter.succeeded(account=data.name)
    session.commit()
    secure = settings.session_cookie_secure
    https = request.url.scheme == "https" or forwarded_https(request, settings)
    response.set_cookie(SESSION_COOKIE, cookie, max_age=settings.session_ttl_s, path="/", httponly=True,
                        samesite="lax", secure=https if secure is None else secure)
    return _read(settings, auth.session_identity(session=session, cookie=cookie))


@router.post("/logout", status_code=204, response_class=Response)
def logout(request: Request, session: SessionDep) -> Response:
    """End this browser's session (no-op without one) and clear its cookie."""
    if cookie := request.cookies.get(SESSION_COOKIE):
        auth.logout(session=session, cookie=cookie)
        session.commit()
    response = Response(status_code=204)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="lax")
    return response


@router.get("/me", response_model=IdentityRead)
def me(found: Annotated[Identity | None, Depends(require("read"))], settings: SettingsDep) -> IdentityRead:
    """Who the caller is and what it may do (the pages show the name and a logout button)."""
    return _read(settings, found)
