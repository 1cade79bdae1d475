"""Pages and static files, cached by browsers and sent compressed.

Each file is read, hashed and gzipped once (again when it changes on disk). Pages name their scripts and
styles with `?v=<hash>`, so a versioned URL never changes content and is cached for a year as
`immutable`; a page itself, and an unversioned URL, is revalidated by ETag (a 304 without the body).
plotly.min.js (4.8 MB, 1.4 MB gzipped) is thus fetched once per version per browser."""

from __future__ import annotations

import gzip
import hashlib
import mimetypes
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fastapi import HTTPException, Request
from fastapi.responses import Response

IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"  # store, but ask (If-None-Match) before each use
_REF = re.compile(r'((?:src|href)=")/static/([^"?#]+)(")')


@dataclass(frozen=True)
class Asset:
    body: bytes
    gzipped: bytes
    etag: str
    media_type: str
    mtime_ns: int

    @property
    def version(self) -> str:
        return self.etag.strip('"')[:12]


_cache: dict[Path, Asset] = {}


def _media_type(path: Path) -> str:
    if path.suffix == ".js":
        return "application/javascript"
    return mimetypes.guess_type(path.name)[0] or "application/octet-stream"


def asset(path: Path, body: bytes | None = None) -> Asset:
    """The file's bytes, gzipped bytes and ETag, read again only when the file changed."""
    mtime = path.stat().st_mtime_ns
    cached = _cache.get(path)
    if cached is None or cached.mtime_ns != mtime or (body is not None and cached.body != body):
        data = path.read_bytes() if body is None else body
        cached = Asset(body=data, gzipped=gzip.compress(data, compresslevel=9, mtime=0),
                       etag=f'"{hashlib.sha256(data).hexdigest()[:32]}"', media_type=_media_type(path),
                       mtime_ns=mtime)
        _cache[path] = cached
    return cached


class Stored(Protocol):
    """Bytes served as they are, with their gzipped copy and ETag computed once: a file (Asset) or a
    finished job's response (services.cache.Cached)."""

    @property
    def body(self) -> bytes: ...
    @property
    def gzipped(self) -> bytes: ...
    @property
    def etag(self) -> str: ...
    @property
    def media_type(self) -> str: ...


def respond(request: Request, item: Stored, *, cache_control: str) -> Response:
    """200 with the body (gzipped when the client takes it) or 304 when the client's copy is current."""
    headers = {"ETag": item.etag, "Cache-Control": cache_control, "Vary": "Accept-Encoding"}
    if item.etag in [t.strip() for t in request.headers.get("if-none-match", "").split(",")]:
        return Response(status_code=304, headers=headers)
    if "gzip" in request.headers.get("accept-encoding", "") and len(item.gzipped) < len(item.body):
        return Response(item.gzipped, media_type=item.media_type, headers={**headers, "Content-Encoding": "gzip"})
    return Response(item.body, media_type=item.media_type, headers=headers)


def static_file(request: Request, static_dir: Path, name: str, overrides: dict[str, Path]) -> Response:
    """A file under `static_dir` (or one of `overrides`, e.g. plotly.min.js from the plotly package);
    cached for a year when the URL names its current version (?v=), revalidated otherwise."""
    path = overrides.get(name) or (static_dir / name).resolve()
    if name not in overrides and (static_dir.resolve() not in path.parents or not path.is_file()):
        raise HTTPException(404, "Not Found")
    item = asset(path)
    versioned = request.query_params.get("v") == item.version
    return respond(request, item, cache_control=IMMUTABLE if versioned else REVALIDATE)


def page(request: Request, path: Path, html: str, static_dir: Path, overrides: dict[str, Path]) -> Response:
    """An HTML page (`html`, rendered from the file at `path`) whose /static/ references carry their files'
    versions (?v=hash)."""

    def versioned(match: re.Match[str]) -> str:
        name = match.group(2)
        target = overrides.get(name) or static_dir / name
        if not target.is_file():
            return match.group(0)
        return f"{match.group(1)}/static/{name}?v={asset(target).version}{match.group(3)}"

    item = asset(path, _REF.sub(versioned, html).encode())
    return respond(request, item, cache_control=REVALIDATE)


def favicon(request: Request, static_dir: Path) -> Response:
    """/favicon.ico, which browsers ask for on their own: the icon the pages link to, as an ICO."""
    return respond(request, asset(static_dir / "favicon.ico"), cache_control=REVALIDATE)
