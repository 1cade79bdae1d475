"""Users, API tokens and browser sessions of auth mode `local`: who someone is and what they may do.

Passwords are kept as argon2id hashes; tokens and session cookies are random and only their sha256 is
stored, so a copy of the database lets no one in."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, get_args

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from detlab.backend.models import ApiToken, BrowserSession, User, utcnow
from detlab.backend.services.workers import as_utc
from detlab.core.text import text_error

Role = Literal["viewer", "member", "admin", "worker"]
Scope = Literal["read", "submit", "ingest", "worker", "admin"]
ROLES: tuple[Role, ...] = get_args(Role)
SCOPES: tuple[Scope, ...] = get_args(Scope)
# What a role may do, and so the most a token of its user can grant. `submit` without `read` would let a
# CI job start work it cannot follow, so every role and scope that submits also reads. Scope `worker` (claim any
# run, heartbeat as a worker) is a worker node's credential, never a person's: only a user of role `worker` (a
# node, which may do nothing else) holds it.
ROLE_SCOPES: dict[str, frozenset[str]] = {
    "viewer": frozenset({"read"}),
    "member": frozenset({"read", "submit", "ingest"}),
    "admin": frozenset(SCOPES) - {"worker"},
    "worker": frozenset({"worker"}),
}
IMPLIED: dict[str, frozenset[str]] = {"read": frozenset({"read"}), "submit": frozenset({"read", "submit"}),
                                      "ingest": frozenset({"ingest"}), "worker": frozenset({"worker"}),
                                      "admin": frozenset(SCOPES) - {"worker"}}
MIN_PASSWORD = 8
_hasher = PasswordHasher()

# Verified against when the user does not exist, so a wrong name takes as long as a wrong password. A fixed
# hash (of a random password, thrown away; the answer is ignored anyway) with the hasher's default parameters:
# hashing one at import cost every start of the API a noticeable part of a second.
_DUMMY_HASH = "$argon2id$v=19$m=65536,t=3,p=4$ZCihjFTWxUo6Qtr11zKc0w$zqXhgMrYt37joNJGRCfFnhJxyFdUtG1N8z5eV1X4RJE"


class AuthError(ValueError):
    """Something a user asked for that cannot be done; the message says why."""


@dataclass(frozen=True)
class Identity:
    """Who a request is from and what it may do (a session: its role's scopes; a token: its own)."""

    name: str
    scopes: frozenset[str]


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def expand(scopes: list[str] | frozenset[str]) -> frozenset[str]:
    return frozenset().union(*(IMPLIED.get(s, frozenset()) for s in scopes))


def create_user(*, session: Session, name: str, role: str, password: str) -> User:
    if problem := text_error(name) or ("is empty" if not name.strip() else None):
        raise AuthError(f"user name {problem}")
    if len(name) > 64 or name != name.strip():
        raise AuthError("a user name has at most 64 characters and no surrounding spaces")
    if role not in ROLES:
        raise AuthError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    if len(password) < MIN_PASSWORD:
        raise AuthError(f"a password needs at least {MIN_PASSWORD} characters")
    if session.scalar(select(User).where(User.name == name)):
        raise AuthError(f"user {name!r} exists")
    user = User(name=name, role=role, password_hash=_hasher.hash(password))
    session.add(user)
    session.flush()
    return user


def create_token(*, session: Session, user_name: str, scopes: list[str]) -> tuple[ApiToken, str]:
    """A new token for the user: its row and the token itself, returned once and stored as its sha256."""
    user = session.scalar(select(User).where(User.name == user_name))
    if user is None:
        raise AuthError(f"no user {user_name!r} (add one with `detlab user add`)")
    if not scopes or (unknown := set(scopes) - set(SCOPES)):
        raise AuthError(f"unknown scope {', '.join(sorted(unknown)) if scopes else '(none given)'}: "
                        f"one or more of {', '.join(SCOPES)}")
    if beyond := expand(scopes) - ROLE_SCOPES[user.role]:
        raise AuthError(f"user {user_name!r} is a {user.role} and cannot hold scope {', '.join(sorted(beyond))}")
    token = f"detlab_{secrets.token_urlsafe(32)}"
    row = ApiToken(user_id=user.id, token_hash=digest(token), scopes=sorted(set(scopes)))
    session.add(row)
    session.flush()
    return row, token


def list_tokens(*, session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))


def revoke_token(*, session: Session, token_id: int) -> ApiToken:
    found = session.get(ApiToken, token_id)
    if found is None:
        raise AuthError(f"no token {token_id} (`detlab token list` shows them)")
    session.delete(found)
    session.flush()
    return found


def token_identity(*, session: Session, token: str) -> Identity | None:
    """The token's user and scopes, cut to what the user's role allows now (a role may have been lowered)."""
    found = session.scalar(select(ApiToken).where(ApiToken.token_hash == digest(token)))
    if found is None:
        return None
    return Identity(name=found.user.name, scopes=expand(found.scopes) & ROLE_SCOPES[found.user.role])


def login(*, session: Session, name: str, password: str, ttl_s: int) -> tuple[str, User]:
    """A new session cookie value for a correct name and password; AuthError otherwise."""
    user = session.scalar(select(User).where(User.name == name))
    try:
        _hasher.verify(user.password_hash if user else _DUMMY_HASH, password)
    except (VerificationError, InvalidHashError):
        user = None
    if user is None:
        raise AuthError("wrong user name or password")
    now = utcnow()
    session.execute(delete(BrowserSession).where(BrowserSession.expires_at < now))  # keep the table small
    cookie = secrets.token_urlsafe(32)
    session.add(BrowserSession(user_id=user.id, token_hash=digest(cookie), expires_at=now + timedelta(seconds=ttl_s)))
    session.flush()
    return cookie, user


def session_identity(*, session: Session, cookie: str) -> Identity | None:
    found = session.scalar(select(BrowserSession).where(BrowserSession.token_hash == digest(cookie)))
    expires = as_utc(found.expires_at) if found else None
    if found is None or expires is None or expires <= utcnow():
        return None
    # A browser acts for its user, never as a worker or a recording script: no ingest, no worker.
    return Identity(name=found.user.name, scopes=ROLE_SCOPES[found.user.role] - {"ingest", "worker"})


def logout(*, session: Session, cookie: str) -> None:
    session.execute(delete(BrowserSession).where(BrowserSession.token_hash == digest(cookie)))

