"""Who a web request is for: the principal of a verified JWT in `Authorization: Bearer`.

    AGENT_WEB_JWT_SECRET=...        HS256 tokens signed with this shared secret, or
    AGENT_WEB_JWKS=/path/jwks.json  tokens signed by a key of this JWKS file (RS256, ES256, ...)
    AGENT_WEB_JWT_ISSUER=...        when set, the `iss` a token must have
    AGENT_WEB_JWT_AUDIENCE=...      when set, the `aud` a token must have

A token must be signed by the key, unexpired (`exp` is required), and name its user
(`sub`); its `tenant` claim is the tenant (else `default`), `roles` its roles (a list),
`name` its display name. Anything else is a 401 with one line, and the request goes no
further. With neither setting, there is no login: the chat runs for one local user
(`Authenticator` is None) and says so.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from pydantic import ValidationError

from durable_agent.errors import AgentClientError
from durable_agent.principal import DEFAULT_TENANT, Principal

SECRET_SETTING = "AGENT_WEB_JWT_SECRET"
JWKS_SETTING = "AGENT_WEB_JWKS"
ISSUER_SETTING = "AGENT_WEB_JWT_ISSUER"
AUDIENCE_SETTING = "AGENT_WEB_JWT_AUDIENCE"
MAX_TOKEN_CHARS = 8_192
"""A bearer token longer than this is refused before it is parsed."""
ASYMMETRIC = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"]


class Unauthenticated(Exception):
    """No valid token: the message says why, in one line (answered as 401)."""


@dataclass(frozen=True)
class Authenticator:
    """Verifies bearer tokens with one shared secret (HS256) or a JWKS's keys."""

    secret: str = ""
    keys: jwt.PyJWKSet | None = None
    issuer: str = ""
    audience: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Authenticator | None:
        """As the settings say; None when neither a secret nor a JWKS is set. A JWKS
        file that cannot be read is an `AgentClientError` in one line, at start."""
        env = os.environ if environ is None else environ
        secret = env.get(SECRET_SETTING, "")
        path = env.get(JWKS_SETTING, "").strip()
        if not secret and not path:
            return None
        if secret and path:
            raise AgentClientError(f"set {SECRET_SETTING} or {JWKS_SETTING}, not both")
        keys = None
        if path:
            try:
                keys = jwt.PyJWKSet.from_dict(json.loads(Path(path).read_text()))
            except (OSError, ValueError, jwt.PyJWKSetError) as e:
                raise AgentClientError(
                    f"{JWKS_SETTING}={path}: not a readable JWKS ({e})"
                ) from None
        return cls(
            secret=secret,
            keys=keys,
            issuer=env.get(ISSUER_SETTING, "").strip(),
            audience=env.get(AUDIENCE_SETTING, "").strip(),
        )

    def principal(self, authorization: str | None) -> Principal:
        """The principal of a request's `Authorization` header; `Unauthenticated`."""
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("send Authorization: Bearer <token>")
        if len(token) > MAX_TOKEN_CHARS:
            raise Unauthenticated(f"the token is over {MAX_TOKEN_CHARS:,} characters")
        try:
            claims = jwt.decode(
                token,
                key=self._key(token),
                algorithms=["HS256"] if self.secret else ASYMMETRIC,
                issuer=self.issuer or None,
                audience=self.audience or None,
                options={
                    "require": ["exp", "sub"],
                    "verify_aud": bool(self.audience),
                    "verify_iss": bool(self.issuer),
                },
            )
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("the token has expired") from None
        except jwt.InvalidAudienceError:
            raise Unauthenticated("the token is not for this audience") from None
        except jwt.InvalidIssuerError:
            raise Unauthenticated("the token is not from the expected issuer") from None
        except jwt.InvalidSignatureError:
            raise Unauthenticated("the token's signature does not verify") from None
        except jwt.PyJWTError as e:
            raise Unauthenticated(f"the token is not valid: {str(e)[:120]}") from None
        return _principal_of(claims)

    def _key(self, token: str) -> Any:
        if self.secret:
            return self.secret
        assert self.keys is not None
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.PyJWTError as e:
            raise Unauthenticated(f"the token is not valid: {str(e)[:120]}") from None
        for key in self.keys.keys:
            if kid is None or key.key_id == kid:
                return key.key
        raise Unauthenticated("the token's key is not in the JWKS")


STREAM_TICKET_S = 60
"""How long a stream ticket opens its stream: long enough to open it, short enough that
one read from a log or a history opens nothing."""
STREAM_PATH = re.compile(r"/api/(chats|turns)/[^/]+/events|/api/turns/[^/]+/files/\d{1,3}")
"""The only paths a ticket opens: a conversation's or a turn's events, and one file of a
turn (an `<img>` or a download link sends no header either)."""
TICKET_AUDIENCE = "durable-agent-web-stream"


@dataclass(frozen=True)
class StreamTickets:
    """Short-lived tickets that let a browser's `EventSource`, `<img>` or link, which
    cannot send an `Authorization` header, open one stream or one file as the principal
    of a verified token: the page POSTs for a ticket with its bearer token, then opens
    `PATH?ticket=...`.

    A ticket names one path and the principal, expires after `STREAM_TICKET_S`, and is
    signed with a key this process draws at start (a restart voids them all). It opens
    that path only: it decides nothing, and the stream or file still answers only for
    the principal's own turns. The login's JWT itself is never taken from a URL."""

    key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    def issue(self, principal: Principal, path: str) -> str:
        if not STREAM_PATH.fullmatch(path):
            raise ValueError(
                "a ticket opens /api/chats/ID/events, /api/turns/ID/events or /api/turns/ID/files/N"
            )
        claims = {
            "sub": principal.user,
            "tenant": principal.tenant,
            "roles": list(principal.roles),
            "name": principal.display_name,
            "path": path,
            "aud": TICKET_AUDIENCE,
            "exp": int(time.time()) + STREAM_TICKET_S,
        }
        return jwt.encode(claims, self.key, algorithm="HS256")

    def principal(self, ticket: str, path: str) -> Principal:
        """The principal a ticket was issued to, for the stream at `path`;
        `Unauthenticated` for any other path, an expired ticket or a forged one."""
        if len(ticket) > MAX_TOKEN_CHARS:
            raise Unauthenticated(f"the ticket is over {MAX_TOKEN_CHARS:,} characters")
        try:
            claims = jwt.decode(
                ticket,
                self.key,
                algorithms=["HS256"],
                audience=TICKET_AUDIENCE,
                options={"require": ["exp", "sub", "path"]},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("the stream ticket has expired: ask for another") from None
        except jwt.PyJWTError:
            raise Unauthenticated("the stream ticket is not valid") from None
        if claims["path"] != path:
            raise Unauthenticated("the stream ticket is for another stream or file")
        return _principal_of(claims)


def _principal_of(claims: dict[str, Any]) -> Principal:
    roles = claims.get("roles", [])
    try:
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise ValueError("roles must be a list of strings")
        return Principal(
            user=str(claims["sub"]),
            tenant=str(claims.get("tenant") or DEFAULT_TENANT),
            roles=tuple(roles),
            display_name=str(claims.get("name") or ""),
        )
    except (ValidationError, ValueError) as e:
        message = e.errors()[0]["msg"] if isinstance(e, ValidationError) else str(e)
        raise Unauthenticated(f"the token's claims cannot be used: {message}") from None


__all__ = ["Authenticator", "StreamTickets", "Unauthenticated"]
