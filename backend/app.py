"""The FastAPI application: JSON API, ingest, pages and static files (plotly.js served locally)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import plotly
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

import frontend
from backend.api import ingest, jobs, meta
from backend.settings import get_settings

FRONTEND = Path(frontend.__file__).parent
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def create_app(*, reconciler: bool = True) -> FastAPI:
    settings = get_settings()

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        thread = None
        if reconciler:
            from backend.reconcile import ReconcilerThread

            thread = ReconcilerThread(settings)
            thread.start()
        yield
        if thread:
            thread.stop.set()

    app = FastAPI(title="detlab", version="0.1.0", lifespan=lifespan)

    @app.middleware("http")
    async def cap_body(request: Request, call_next):  # type: ignore[no-untyped-def]
        length = request.headers.get("content-length")
        if length and (not length.isdigit() or int(length) > settings.max_body_bytes):
            return JSONResponse({"detail": f"request body over {settings.max_body_bytes} bytes"}, status_code=413)
        return await call_next(request)

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
