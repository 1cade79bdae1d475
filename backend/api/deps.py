"""Dependencies injected into the routers."""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import quote

from fastapi import Depends, Header, HTTPException, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from detlab.backend.db import get_session
from detlab.backend.services import auth
from detlab.backend.services.auth import Identity
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


SESSION_COOKIE = "detlab_session"
MAX_USER_NAME = 64  # the users and jobs tables' column width


def bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def _trusted_peer(request: Request, settings: Settings) -> bool:
    try:
        peer = ipaddress.ip_address(request.client.host if request.client else "")
    except ValueError:
        return False
    return any(peer in ipaddress.ip_network(n, strict=False) for n in settings.trusted_proxies)


def forwarded_https(request: Request, settings: Settings) -> bool:
    """The request reached a trusted proxy over https (its X-Forwarded-Proto), though it arrives here as http."""
    proto = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return proto == "https" and _trusted_peer(request, settings)


def _proxy_identity(request: Request, settings: Settings) -> Identity | None:
    header = settings.proxy_user_header
    values = request.headers.getlist(header)
    if not values:
        return None
    # Sent twice (or joined by a comma on the way), one copy may be the client's own: trust neither.
    if len(values) > 1 or "," in values[0]:
        raise HTTPException(400, f"the {header} header is sent more than once; the proxy must set it exactly once")
    if not _trusted_peer(request, settings):
        peer = request.client.host if request.client else "an unknown address"
        raise HTTPException(401, f"the {header} header is trusted only from DETLAB_TRUSTED_PROXIES "
                                 f"({', '.join(settings.trusted_proxies)}); this request came from {peer}")
    try:  # HTTP headers arrive as latin-1; proxies send a UTF-8 user name's bytes as they are
        user = values[0].encode("latin-1").decode("utf-8").strip()
    except UnicodeError:
        raise HTTPException(400, f"the {header} header is not UTF-8") from None
    if not user:
        return None
    if problem := text_error(user):  # it is stored as the job's submitter
        raise HTTPException(400, f"the {header} header {problem}")
    if len(user) > MAX_USER_NAME:  # never cut: two long names sharing 64 characters would be one user
        raise HTTPException(400, f"the {header} header holds a user name of {len(user)} characters; "
                                 f"at most {MAX_USER_NAME} are stored")
    return Identity(name=user, scopes=PROXY_SCOPES)


# Users the proxy vouches for submit and read; tokens and roles belong to auth mode `local`.
PROXY_SCOPES = auth.IMPLIED["submit"]


# The dependencies below that touch no database are coroutines: a plain function would run in the thread
# pool, a hand-off there and back on every request (with 20 readers, most of a cached read's time).


async def identity(request: Request, settings: SettingsDep, session: SessionDep) -> Identity | None:
    """Who sent the request (None in auth mode none, or when nothing identifies it): the proxy's header,
    or (local) a bearer token, else the browser's session cookie (both looked up in the thread pool)."""
    if settings.auth_mode == "proxy":
        return _proxy_identity(request, settings)
    if settings.auth_mode == "local":
        if token := bearer(request):
            found = await run_in_threadpool(auth.token_identity, session=session, token=token)
            if found is None:
                raise HTTPException(401, "unknown API token; create one with `detlab token create`",
                                    headers={"WWW-Authenticate": "Bearer"})
            return found
        if cookie := request.cookies.get(SESSION_COOKIE):
            return await run_in_threadpool(auth.session_identity, session=session, cookie=cookie)
    return None


IdentityDep = Annotated[Identity | None, Depends(identity)]


def require(scope: auth.Scope) -> Callable[..., Awaitable[Identity | None]]:
    """A dependency: outside auth mode none, a 401 without an identity and a 403 without `scope`."""

    async def check(found: IdentityDep, settings: SettingsDep) -> Identity | None:
        if settings.auth_mode == "none":
            return None
        if found is None:
            how = (f"the request lacks the {settings.proxy_user_header} header" if settings.auth_mode == "proxy"
                   else "log in at /login or send 'Authorization: Bearer <token>' (`detlab token create`)")
            raise HTTPException(401, f"auth mode '{settings.auth_mode}': {how}")
        if scope not in found.scopes:
            raise HTTPException(403, f"{found.name} may not do this: it needs scope '{scope}' "
                                     f"(has {', '.join(sorted(found.scopes)) or 'none'})")
        return found

    return check


Reading = Depends(require("read"))
Submitting = require("submit")


async def current_user(found: Annotated[Identity | None, Depends(Submitting)]) -> str | None:
    """The submitting user (None without auth); submitting and cancelling need scope `submit`."""
    return found.name if found else None


CurrentUser = Annotated[str | None, Depends(current_user)]
Submitter = Annotated[Identity | None, Depends(Submitting)]  # the submitting identity (None without auth)


def may_change(job_id: int, owner: str | None, found: Identity | None, settings: Settings, what: str) -> None:
    """Jobs have an owner, their submitter: only the owner or an admin edits, cancels or reruns one (403 otherwise),
    unless the team shares its jobs (DETLAB_SHARED_JOBS). Reading stays team-wide. No identity: auth mode none."""
    if found is None or settings.shared_jobs or "admin" in found.scopes or (owner is not None and owner == found.name):
        return
    owned = f"{owner}'s" if owner else "no one's (submitted without auth)"
    raise HTTPException(403, f"job {job_id} is {owned}: only its owner or an admin may {what} it, and "
                             f"{found.name} is neither")


async def page_access(request: Request, found: IdentityDep, settings: SettingsDep) -> None:
    """Pages hold no data (their API calls need the identity), but in auth mode local a browser that is not
    logged in is sent to the login page first, and back after."""
    if settings.auth_mode == "local" and found is None:
        raise HTTPException(303, "log in first", headers={"Location": f"/login?next={quote(request.url.path)}"})


PageAccess = Depends(page_access)


@dataclass(frozen=True)
class IngestCaller:
    """Who sends to ingest. `worker`: holds a worker credential (the server's DETLAB_INGEST_TOKEN, or an API token
    with scope `worker`): it may claim runs and heartbeat as a worker. `name`: the token's user, the identity that
    owns the recordings it opens (None for the server's token, which is no user's)."""

    name: str | None
    worker: bool


def ingest_caller(settings: SettingsDep, session: SessionDep,
                  authorization: Annotated[str | None, Header()] = None) -> IngestCaller:
    """A worker credential, or an API token with scope `ingest` (the SDK in a user's script); else 401/403.

    In auth mode none (loopback only, where anyone who reaches the API may already submit and cancel) a request
    without a token is taken as the local user's, never a worker's: a local `detlab.Recorder(server=...)` streams
    with no set-up. A token that is sent is still checked."""
    expected = settings.resolved_ingest_token()
    given = (authorization or "").removeprefix("Bearer ").strip()
    if settings.auth_mode == "none" and not given:
        return IngestCaller(name=None, worker=False)
    if given and hmac.compare_digest(given.encode(), expected.encode()):
        return IngestCaller(name=None, worker=True)
    found = auth.token_identity(session=session, token=given) if given else None
    if found is None:
        raise HTTPException(401, "ingest needs 'Authorization: Bearer <token>': a worker's credential "
                                 "(DETLAB_INGEST_TOKEN, or a token with scope 'worker') or an API token with scope "
                                 "'ingest' (`detlab token create --user NAME --scope ingest`; docs/sdk.md)",
                            headers={"WWW-Authenticate": "Bearer"})
    if not found.scopes & {"ingest", "worker"}:
        raise HTTPException(403, f"{found.name}'s token lacks scope 'ingest' (or 'worker')")
    return IngestCaller(name=found.name, worker="worker" in found.scopes)


IngestCallerDep = Annotated[IngestCaller, Depends(ingest_caller)]
IngestAuth = Depends(ingest_caller)


async def worker_caller(caller: IngestCallerDep) -> IngestCaller:
    """Claiming runs and heartbeating as a worker need a worker credential, never a user's ingest token."""
    if not caller.worker:
        raise HTTPException(403, f"{caller.name} may not act as a worker: claiming runs and worker heartbeats need a "
                                 "worker credential (DETLAB_INGEST_TOKEN, or a token with scope 'worker' that an admin "
                                 "creates: `detlab token create --user NAME --scope worker`)")
    return caller


WorkerCaller = Annotated[IngestCaller, Depends(worker_caller)]
