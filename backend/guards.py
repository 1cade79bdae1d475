"""Checks on every request before any route, in every auth mode: the Host header against the allowed
hosts (DNS rebinding), the Origin of state-changing browser requests (CSRF), and security headers on
every response."""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.requests import cookie_parser
from starlette.responses import JSONResponse

from detlab.core.settings import Settings
from detlab.core.text import escaped

Scope = dict[str, Any]

CSP = "; ".join([
    "default-src 'self'",
    "script-src 'self'",  # no inline script or handler anywhere: the pages load theirs from /static
    "style-src 'self' 'unsafe-inline'",  # plotly.js styles its charts through <style> elements it writes
    "img-src 'self' data: blob:",
    "font-src 'self' data:",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
])
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
]
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# A name or a bracketed IPv6 address, then an optional port: nothing else belongs in a Host header.
HOST = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+)(:\d{1,5})?$")


def host_name(host: str) -> str | None:
    """The name of a Host header value ('localhost' of 'localhost:8000', '::1' of '[::1]:8000'), or None."""
    found = HOST.match(host)
    return found.group(1).strip("[]").lower() if found else None


class Guard:
    """ASGI middleware: 400 for a Host not in `settings.allowed_hosts`; 403 for a POST/PUT/PATCH/DELETE
    that carries the session cookie or an Origin header unless the Origin is this very host (workers and
    the CLI send neither); the security headers on every response, refusals included."""

    def __init__(self, app: Any, *, settings: Settings, session_cookie: str) -> None:
        self.app, self.settings, self.session_cookie = app, settings, session_cookie

    def refusal(self, scope: Scope) -> tuple[int, str] | None:
        headers = Headers(scope=scope)
        hosts = headers.getlist("host")
        if len(hosts) != 1:
            return 400, "the request needs exactly one Host header"
        host = hosts[0]
        if host_name(host) not in self.settings.allowed_hosts:
            return 400, (f"Host {escaped(host)!r} is not served here; add its name to DETLAB_ALLOWED_HOSTS "
                         f"(now: {', '.join(self.settings.allowed_hosts)})")
        if scope["method"] in STATE_CHANGING:
            origin = headers.get("origin")
            has_session = self.session_cookie in cookie_parser(headers.get("cookie", ""))
            same_origin = origin is not None and urlsplit(origin).netloc.lower() == host.lower()
            if (origin is not None or has_session) and not same_origin:
                return 403, (f"cross-origin request refused: Origin {escaped(origin or '(none)')!r} is not "
                             f"this server ({escaped(host)})")
        return None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def secured_send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        problem = self.refusal(scope)
        if problem:
            status, detail = problem
            await JSONResponse({"detail": detail}, status_code=status)(scope, receive, secured_send)
            return
        await self.app(scope, receive, secured_send)
