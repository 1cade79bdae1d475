"""The FastAPI application: JSON API, ingest, pages and static files (plotly.js served locally)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib.resources import files
from pathlib import Path

import plotly
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from detlab.backend import pages, static
from detlab.backend.api import auth, compare, diagnosis, findings, ingest, jobs, meta
from detlab.backend.api.deps import SESSION_COOKIE, PageAccess, Reading
from detlab.backend.figures.train import warm_up as warm_up_figures
from detlab.backend.guards import Guard
from detlab.backend.limits import BodyLimit
from detlab.backend.services.login_limit import LoginLimiter
from detlab.core.settings import Settings, get_settings
from detlab.core.text import escaped

log = logging.getLogger(__name__)
RETRY_AFTER_S = 5  # what a 503 for a database outage asks a client to wait
FRONTEND = Path(str(files("detlab.frontend")))
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
STATIC_OVERRIDES = {"plotly.min.js": PLOTLY_JS}  # served as /static/plotly.min.js, from the plotly package


def create_app(*, reconciler: bool = True, settings: Settings | None = None) -> FastAPI:
    """The app. `settings` (the environment's when None) fix what is set once at start: the body cap and
    the reconciler's; requests read theirs through the SettingsDep dependency."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        thread = None
        if reconciler:
            from detlab.backend.services.reconcile import ReconcilerThread

            thread = ReconcilerThread(settings)
            thread.start()
        warm_up_figures()  # plotly loads its templates and validators on first use: not on a reader's time
        yield
        if thread:
            thread.stop.set()

    # No /docs or /redoc: their pages load scripts from a CDN and run an inline one, which the CSP
    # (detlab.backend.guards) refuses. The schema is at /openapi.json.
    app = FastAPI(title="detlab", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.login_limiter = LoginLimiter.from_settings(settings)  # per app: wrong logins, hashes at once

    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    # JSON results and figures; static files come gzipped already (detlab.backend.static) and are skipped.
    app.add_middleware(GZipMiddleware, minimum_size=1024, compresslevel=5)
    app.add_middleware(Guard, settings=settings, session_cookie=SESSION_COOKIE)  # outermost: runs first

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # Each error's place and message, without echoing the input: FastAPI's default answer echoes
        # it, and a NaN there (a blown-up loss, `world_size: NaN`) cannot be written as JSON: a 500.
        # A dict key in `loc` is the input too: one holding NUL or a lone surrogate is written escaped.
        detail = [{"type": e["type"], "loc": [escaped(p) if isinstance(p, str) else p for p in e["loc"]],
                   "msg": escaped(e["msg"])} for e in exc.errors()]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    @app.exception_handler(PoolTimeout)
    async def database_down(request: Request, exc: Exception) -> JSONResponse:
        # The database is unreachable, restarting or saturated: a client may come back (workers and the SDK
        # keep their records and retry), so a 503 with when, never a 500. Its address and error stay in the log.
        log.warning("database unavailable during %s %s: %s", request.method, request.url.path, exc)
        return JSONResponse({"detail": "the database is unavailable; try again shortly"}, status_code=503,
                            headers={"Retry-After": str(RETRY_AFTER_S)})

    # Outside auth mode none everything but health needs an identity: reading needs scope `read`; submitting
    # and cancelling also `submit` (deps.CurrentUser); ingest takes its own tokens.
    app.include_router(meta.health_router)
    app.include_router(meta.router, dependencies=[Reading])
    app.include_router(findings.router, dependencies=[Reading])
    app.include_router(jobs.router, dependencies=[Reading])
    app.include_router(jobs.runs_router, dependencies=[Reading])
    app.include_router(diagnosis.router, dependencies=[Reading])
    app.include_router(compare.router, dependencies=[Reading])
    app.include_router(ingest.router)
    app.include_router(auth.router)

    static_dir = FRONTEND / "static"

    @app.get("/static/{name:path}", include_in_schema=False)
    def static_file(name: str, request: Request) -> Response:
        return static.static_file(request, static_dir, name, STATIC_OVERRIDES)

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon(request: Request) -> Response:
        return static.favicon(request, static_dir)

    for entry in pages.PAGES:  # one route per page of the table; the layout is the same for all
        app.add_api_route(entry.path, page_route(entry, static_dir), methods=["GET"], include_in_schema=False,
                          dependencies=[] if entry.public else [PageAccess])

    return app


def page_route(entry: pages.Page, static_dir: Path) -> Callable[[Request], Response]:
    """The handler of one page: its <main> file under frontend/, inside the shared layout."""

    def handler(request: Request) -> Response:
        path = FRONTEND / entry.body
        html = pages.render(entry, path.read_text(encoding="utf-8"))
        return static.page(request, path, html, static_dir, STATIC_OVERRIDES)

    handler.__name__ = f"page_{entry.body.removesuffix('.html')}"
    return handler
