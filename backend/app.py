"""The FastAPI application: JSON API, ingest, pages and static files (plotly.js served locally)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.resources import files
from pathlib import Path

import plotly
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from detlab.backend.api import ingest, jobs, meta
from detlab.backend.limits import BodyLimit
from detlab.core.settings import Settings, get_settings
from detlab.core.text import escaped

FRONTEND = Path(str(files("detlab.frontend")))
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


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
        yield
        if thread:
            thread.stop.set()

    app = FastAPI(title="detlab", version="0.1.0", lifespan=lifespan)

    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # Each error's place and message, without echoing the input: FastAPI's default answer echoes
        # it, and a NaN there (a blown-up loss, `world_size: NaN`) cannot be written as JSON: a 500.
        # A dict key in `loc` is the input too: one holding NUL or a lone surrogate is written escaped.
        detail = [{"type": e["type"], "loc": [escaped(p) if isinstance(p, str) else p for p in e["loc"]],
                   "msg": escaped(e["msg"])} for e in exc.errors()]
        return JSONResponse({"detail": detail}, status_code=422)

    app.include_router(meta.router)
    app.include_router(jobs.router)
    app.include_router(jobs.runs_router)
    app.include_router(ingest.router)

    @app.get("/static/plotly.min.js", include_in_schema=False)
    def plotly_js() -> Response:
        return FileResponse(PLOTLY_JS, media_type="application/javascript")

    app.mount("/static", StaticFiles(directory=FRONTEND / "static"), name="static")

    @app.get("/", include_in_schema=False)
    def index_page() -> Response:
        return FileResponse(FRONTEND / "index.html")

    @app.get("/findings", include_in_schema=False)
    def findings_page() -> Response:
        return FileResponse(FRONTEND / "findings.html")

    @app.get("/jobs/{job_id}", include_in_schema=False)
    def job_page(job_id: int) -> Response:
        return FileResponse(FRONTEND / "job.html")

    return app
