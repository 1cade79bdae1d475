"""Auth modes `local` and `proxy` through the API, on SQLite and PostgreSQL: who may read, submit and ingest,
browser sessions, scoped tokens kept only as hashes, and the proxy's header trusted only from the proxy."""

from __future__ import annotations

import hashlib
import re
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from detlab.backend.app import create_app
from detlab.backend.db import get_session
from detlab.backend.models import ApiToken, BrowserSession, Job, User, utcnow
from detlab.backend.services import auth
from detlab.backend.services.login_limit import Busy, LoginLimiter
from detlab.core.settings import Settings, get_settings
from tests.backend.conftest import LOCAL_URL

INGEST_TOKEN = "i" * 32
PASSWORD = "correct horse battery"
JOB = {"workload": "mlp", "configs": [{}], "world_size": 1, "steps": 2}
SAME_ORIGIN = {"Origin": LOCAL_URL}
BEAT = {"worker": "node:default", "queue": "default"}


@pytest.fixture
def settings(tmp_path) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path, ingest_token=INGEST_TOKEN, auth_mode="local")


def add_user(session: Session, name: str = "ada", role: str = "member") -> User:
    user = auth.create_user(session=session, name=name, role=role, password=PASSWORD)
    session.commit()
    return user


def token_for(session: Session, *scopes: str, name: str = "ada", role: str = "member") -> dict[str, str]:
    if session.scalar(select(User).where(User.name == name)) is None:
        add_user(session, name, role)
    _, token = auth.create_token(session=session, user_name=name, scopes=list(scopes))
    session.commit()
    return {"Authorization": f"Bearer {token}"}


def log_in(client: TestClient, name: str = "ada", password: str = PASSWORD) -> Any:
    return client.post("/api/v1/auth/login", json={"name": name, "password": password}, headers=SAME_ORIGIN)


# ---- local: identity required ---------------------------------------------------------------------------

OPEN = {"/api/v1/health", "/api/v1/live", "/api/v1/auth/login", "/api/v1/auth/logout"}


def test_every_api_route_but_health_and_login_answers_401_without_an_identity(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert len(paths) >= 15
    for template, operations in paths.items():
        path = re.sub(r"\{rank\}", "0", re.sub(r"\{(?!rank\})[^}]+\}", "1", template))
        for method in operations:
            status = client.request(method.upper(), path, json={}).status_code
            assert (status != 401) == (template in OPEN), f"{method} {template}: {status}"


def test_pages_send_a_browser_that_is_not_logged_in_to_the_login_page(client: TestClient) -> None:
    for path in ("/", "/findings", "/jobs/7"):
        resp = client.get(path, follow_redirects=False)
        assert resp.status_code == 303 and resp.headers["location"] == f"/login?next={path}"
    assert client.get("/login").status_code == 200
    assert client.get("/favicon.ico").status_code == 200  # the login page's tab shows the icon too


# ---- local: tokens --------------------------------------------------------------------------------------

def test_a_read_token_reads_but_cannot_submit(client: TestClient, session: Session) -> None:
    headers = token_for(session, "read")
    assert client.get("/api/v1/jobs", headers=headers).status_code == 200
    resp = client.post("/api/v1/jobs", json=JOB, headers=headers)
    assert resp.status_code == 403 and "scope 'submit'" in resp.json()["detail"]
    assert session.scalar(select(Job)) is None


def test_a_submit_token_submits_as_its_user_and_reads_the_job(client: TestClient, session: Session) -> None:
    headers = token_for(session, "submit")
    resp = client.post("/api/v1/jobs", json=JOB, headers=headers)
    assert resp.status_code == 201
    assert session.scalar(select(Job.submitter)) == "ada"
    assert client.get(f"/api/v1/jobs/{resp.json()['id']}", headers=headers).status_code == 200
    assert client.post(f"/api/v1/jobs/{resp.json()['id']}/cancel", headers=headers).status_code == 200


def test_an_ingest_token_may_record_and_nothing_else(client: TestClient, session: Session) -> None:
    from tests.backend.test_recordings import opening

    ingest = token_for(session, "ingest")
    assert client.post("/api/v1/ingest/recordings", json=opening(), headers=ingest).status_code == 200
    assert client.post("/api/v1/ingest/heartbeat", json=BEAT, headers=ingest).status_code == 403  # not a worker
    assert client.get("/api/v1/jobs", headers=ingest).status_code == 403
    read = token_for(session, "read")
    assert client.post("/api/v1/ingest/heartbeat", json=BEAT, headers=read).status_code == 403
    workers_token = {"Authorization": f"Bearer {INGEST_TOKEN}"}  # DETLAB_INGEST_TOKEN: the workers' credential
    assert client.post("/api/v1/ingest/heartbeat", json=BEAT, headers=workers_token).status_code == 200


def test_a_revoked_token_is_a_401(client: TestClient, session: Session) -> None:
    headers = token_for(session, "read")
    auth.revoke_token(session=session, token_id=session.scalars(select(ApiToken.id)).one())
    session.commit()
    assert client.get("/api/v1/jobs", headers=headers).status_code == 401


def test_an_unknown_token_is_a_401(client: TestClient) -> None:
    resp = client.get("/api/v1/jobs", headers={"Authorization": "Bearer detlab_not-a-token"})
    assert resp.status_code == 401 and "detlab token create" in resp.json()["detail"]


def test_a_token_is_stored_only_as_its_sha256(client: TestClient, session: Session) -> None:
    token = token_for(session, "read")["Authorization"].removeprefix("Bearer ")
    row = session.scalars(select(ApiToken)).one()
    assert row.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert token not in repr([getattr(row, c.key) for c in ApiToken.__table__.columns])


def test_a_token_grants_no_more_than_its_users_role_now(client: TestClient, session: Session) -> None:
    with pytest.raises(auth.AuthError, match="is a viewer and cannot hold scope submit"):
        token_for(session, "submit", name="vic", role="viewer")
    headers = token_for(session, "submit")
    user = session.scalars(select(User).where(User.name == "ada")).one()
    user.role = "viewer"  # lowered after the token was made
    session.commit()
    assert client.post("/api/v1/jobs", json=JOB, headers=headers).status_code == 403
    assert client.get("/api/v1/jobs", headers=headers).status_code == 200


def test_passwords_are_kept_as_argon2id_hashes(session: Session) -> None:
    user = add_user(session)
    assert user.password_hash.startswith("$argon2id$") and PASSWORD not in user.password_hash
    with pytest.raises(auth.AuthError, match="at least 8 characters"):
        auth.create_user(session=session, name="bob", role="member", password="short")
    with pytest.raises(auth.AuthError, match="unknown role"):
        auth.create_user(session=session, name="bob", role="root", password=PASSWORD)


# ---- local: browser sessions ----------------------------------------------------------------------------

def test_login_sets_an_httponly_samesite_cookie_and_logout_ends_the_session(client: TestClient,
                                                                            session: Session) -> None:
    add_user(session)
    assert log_in(client, password="wrong password").status_code == 401
    resp = log_in(client)
    assert resp.status_code == 200 and resp.json() == {"auth_mode": "local", "name": "ada",
                                                       "scopes": ["read", "submit"]}
    cookie = resp.headers["set-cookie"]
    assert "detlab_session=" in cookie and "HttpOnly" in cookie and "SameSite=lax" in cookie
    assert "Path=/" in cookie and "Secure" not in cookie  # plain http, not configured
    value = client.cookies["detlab_session"]
    assert session.scalar(select(BrowserSession.token_hash)) == hashlib.sha256(value.encode()).hexdigest()
    assert client.get("/api/v1/jobs").status_code == 200
    assert client.get("/", follow_redirects=False).status_code == 200
    assert client.post("/api/v1/jobs", json=JOB, headers=SAME_ORIGIN).status_code == 201

    assert client.post("/api/v1/auth/logout", headers=SAME_ORIGIN).status_code == 204
    assert "detlab_session" not in client.cookies
    assert client.get("/api/v1/jobs").status_code == 401
    # The old cookie is dead on the server too, not only forgotten by this browser.
    client.cookies.set("detlab_session", value)
    assert client.get("/api/v1/jobs").status_code == 401


@pytest.mark.parametrize("configured, base_url, secure", [(None, "https://localhost", True),
                                                          (True, LOCAL_URL, True), (False, "https://localhost", False)])
def test_the_session_cookie_is_secure_over_https_or_as_configured(client: TestClient, session: Session,
                                                                  settings: Settings, configured: bool | None,
                                                                  base_url: str, secure: bool) -> None:
    add_user(session)
    settings.session_cookie_secure = configured
    client.base_url = base_url  # type: ignore[assignment]
    resp = client.post("/api/v1/auth/login", json={"name": "ada", "password": PASSWORD}, headers={"Origin": base_url})
    assert resp.status_code == 200
    assert ("Secure" in resp.headers["set-cookie"]) == secure


@pytest.mark.parametrize("peer, proto, secure", [(("127.0.0.1", 1), "https", True), (("127.0.0.1", 1), "http", False),
                                                  (("10.9.9.9", 1), "https", False)])
def test_the_session_cookie_is_secure_when_a_trusted_proxy_received_https(session: Session, settings: Settings,
                                                                          peer: tuple[str, int], proto: str,
                                                                          secure: bool) -> None:
    add_user(session)
    app = create_app(reconciler=False, settings=settings)
    app.dependency_overrides[get_session] = lambda: session
    app.dependency_overrides[get_settings] = lambda: settings
    with TestClient(app, base_url=LOCAL_URL, client=peer) as proxied_client:
        resp = proxied_client.post("/api/v1/auth/login", json={"name": "ada", "password": PASSWORD},
                                   headers={**SAME_ORIGIN, "X-Forwarded-Proto": proto})
    assert resp.status_code == 200
    assert ("Secure" in resp.headers["set-cookie"]) == secure


def test_wrong_logins_are_limited_per_account(client: TestClient, session: Session, settings: Settings) -> None:
    add_user(session)
    for _ in range(settings.login_failures_per_account):
        assert log_in(client, password="wrong password").status_code == 401
    refused = log_in(client)  # even the right password waits: the guesser cannot tell
    assert refused.status_code == 429 and 0 < int(refused.headers["retry-after"]) <= settings.login_window_s
    assert log_in(client, "bob", password="wrong password").status_code == 401  # another account is heard


def test_wrong_logins_are_limited_per_address(client: TestClient, session: Session, settings: Settings) -> None:
    add_user(session)
    settings.login_failures_per_address = 3
    client.app.state.login_limiter = LoginLimiter.from_settings(settings)  # type: ignore[attr-defined]
    for name in ("x1", "x2", "x3"):  # a different account each time: the address is what is counted
        assert log_in(client, name, password="wrong password").status_code == 401
    assert log_in(client).status_code == 429


def test_a_right_password_clears_its_accounts_count(client: TestClient, session: Session,
                                                    settings: Settings) -> None:
    add_user(session)
    for _ in range(settings.login_failures_per_account - 1):
        assert log_in(client, password="wrong password").status_code == 401
    assert log_in(client).status_code == 200
    assert log_in(client, password="wrong password").status_code == 401
    assert log_in(client).status_code == 200


def test_a_login_answers_503_while_every_hashing_slot_is_taken(client: TestClient, session: Session) -> None:
    add_user(session)
    limiter: LoginLimiter = client.app.state.login_limiter  # type: ignore[attr-defined]
    limiter.wait_s = 0.05
    with ExitStack() as held:
        for _ in range(Settings().login_concurrent_hashes):
            held.enter_context(limiter.hashing())
        busy = log_in(client)
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
        with pytest.raises(Busy):
            held.enter_context(limiter.hashing())
    assert log_in(client).status_code == 200


def test_the_limiter_forgets_failures_older_than_its_window() -> None:
    now = [0.0]
    limiter = LoginLimiter(per_account=2, per_address=100, window_s=60, hashes=1, clock=lambda: now[0])
    limiter.failed(account="ada", address="a")
    now[0] = 30
    limiter.failed(account="ada", address="a")
    assert limiter.retry_after(account="ada", address="a") == 30
    now[0] = 61
    assert limiter.retry_after(account="ada", address="a") is None


def test_a_viewer_session_reads_but_cannot_submit(client: TestClient, session: Session) -> None:
    add_user(session, "vic", "viewer")
    assert log_in(client, "vic").status_code == 200
    assert client.get("/api/v1/jobs").status_code == 200
    assert client.post("/api/v1/jobs", json=JOB, headers=SAME_ORIGIN).status_code == 403


def test_an_expired_session_is_refused(client: TestClient, session: Session) -> None:
    add_user(session)
    assert log_in(client).status_code == 200
    row = session.scalars(select(BrowserSession)).one()
    row.expires_at = utcnow() - timedelta(seconds=1)
    session.commit()
    assert client.get("/api/v1/jobs").status_code == 401


def test_a_session_post_without_its_origin_is_refused(client: TestClient, session: Session) -> None:
    add_user(session)
    assert log_in(client).status_code == 200
    assert client.post("/api/v1/jobs", json=JOB).status_code == 403
    assert client.post("/api/v1/jobs", json=JOB, headers={"Origin": "http://evil.example"}).status_code == 403
    assert session.scalar(select(Job)) is None


def test_login_is_only_for_local_mode(client: TestClient, session: Session, settings: Settings) -> None:
    add_user(session)
    settings.auth_mode = "none"
    assert log_in(client).status_code == 409
    assert client.get("/api/v1/auth/me").json() == {"auth_mode": "none", "name": None, "scopes": []}


# ---- proxy ----------------------------------------------------------------------------------------------

@pytest.fixture
def proxied(client: TestClient, settings: Settings) -> TestClient:
    settings.auth_mode = "proxy"
    return client


def test_proxy_users_read_and_submit_through_the_trusted_proxy(proxied: TestClient, session: Session) -> None:
    user = {"X-Forwarded-User": "grace"}
    assert proxied.get("/api/v1/jobs").status_code == 401
    assert proxied.get("/api/v1/jobs", headers=user).status_code == 200
    assert proxied.post("/api/v1/jobs", json=JOB, headers=user).status_code == 201
    assert session.scalar(select(Job.submitter)) == "grace"


def test_the_proxy_header_from_an_untrusted_address_is_refused(proxied: TestClient, settings: Settings) -> None:
    direct = TestClient(proxied.app, base_url=LOCAL_URL, client=("192.0.2.7", 40000))
    resp = direct.get("/api/v1/jobs", headers={"X-Forwarded-User": "admin"})
    assert resp.status_code == 401
    assert "DETLAB_TRUSTED_PROXIES (127.0.0.1, ::1)" in resp.json()["detail"] and "192.0.2.7" in resp.json()["detail"]
    settings.trusted_proxies = ["192.0.2.0/24"]
    assert direct.get("/api/v1/jobs", headers={"X-Forwarded-User": "admin"}).status_code == 200


@pytest.mark.parametrize("headers", [[("X-Forwarded-User", "grace"), ("X-Forwarded-User", "admin")],
                                     [("X-Forwarded-User", "grace, admin")]], ids=["twice", "joined"])
def test_the_proxy_header_sent_twice_is_a_400(proxied: TestClient, headers: list[tuple[str, str]]) -> None:
    resp = proxied.get("/api/v1/jobs", headers=headers)
    assert resp.status_code == 400 and "more than once" in resp.json()["detail"]


def test_a_proxy_user_name_over_64_characters_is_refused_never_cut(proxied: TestClient, session: Session) -> None:
    long = "g" * 65
    resp = proxied.post("/api/v1/jobs", json=JOB, headers={"X-Forwarded-User": long})
    assert resp.status_code == 400 and "65 characters" in resp.json()["detail"]
    assert session.scalar(select(Job)) is None
    assert proxied.get("/api/v1/jobs", headers={"X-Forwarded-User": "g" * 64}).status_code == 200


def test_a_proxy_user_name_is_read_as_utf8(proxied: TestClient, session: Session) -> None:
    name = "Grâce Hoppér".encode()  # the proxy passes the UTF-8 bytes on; the API reads them as latin-1 first
    assert proxied.post("/api/v1/jobs", json=JOB, headers={"X-Forwarded-User": name}).status_code == 201
    assert session.scalar(select(Job.submitter)) == "Grâce Hoppér"


def test_the_servers_ingest_token_opens_an_sdk_recording_in_local_mode(client: TestClient) -> None:
    from tests.backend.test_recordings import opening

    resp = client.post("/api/v1/ingest/recordings", json=opening(),
                       headers={"Authorization": f"Bearer {INGEST_TOKEN}"})
    assert resp.status_code == 200, resp.text


def test_a_recording_without_a_token_in_local_mode_is_told_how_to_get_one(client: TestClient) -> None:
    from tests.backend.test_recordings import opening

    resp = client.post("/api/v1/ingest/recordings", json=opening())
    assert resp.status_code == 401
    assert "detlab token create" in resp.json()["detail"]
