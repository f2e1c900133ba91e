"""Bearer tokens and roles.

Calls over the unix socket are trusted: the socket's file mode (0660) is the guard, as
for the Docker or containerd sockets. Calls over TCP must carry `authorization: Bearer
<token>`; the token's role decides what the caller may do:

  observer  read-only views (snapshot, watch, decisions, estimate)
  engine    the engine service, plus everything an observer may do
  admin     everything, including policy switches, quotas and drain

Tokens are compared in constant time (hmac.compare_digest) against every known token,
so the time a failed check takes says nothing about how close a guess was.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Mapping

import grpc


class Role(str, enum.Enum):
    OBSERVER = "observer"
    ENGINE = "engine"
    ADMIN = "admin"


# What each role may do, by the permission a method needs.
_GRANTS: dict[Role, frozenset[Role]] = {
    Role.OBSERVER: frozenset({Role.OBSERVER}),
    Role.ENGINE: frozenset({Role.OBSERVER, Role.ENGINE}),
    Role.ADMIN: frozenset({Role.OBSERVER, Role.ENGINE, Role.ADMIN}),
}


_ADMIN = Role.ADMIN  # enum member lookups are slow on Python 3.11; this runs per call


class AuthError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def bearer_token(metadata: object) -> str | None:
    """The token of an `authorization: Bearer <token>` header, or None."""
    for key, value in metadata or ():
        if key.lower() == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def is_local_peer(peer: str) -> bool:
    return peer.startswith("unix:") or peer.startswith("unix-abstract:")


class Authorizer:
    """Decides a caller's role from its peer address and metadata."""

    def __init__(self, tokens: Mapping[str, str] | None, *, trust_tcp: bool = False) -> None:
        """`trust_tcp`: TCP callers get full access without a token (TLS-only setups and
        the explicit allow_insecure_tcp opt-in; the config refuses TCP otherwise)."""
        self._tokens = [(token.encode(), Role(role)) for token, role in (tokens or {}).items()]
        self._trust_tcp = trust_tcp

    def replace_tokens(self, tokens: Mapping[str, str]) -> None:
        """New tokens from now on (a reload); calls already let in keep going. One
        assignment, so a call checks against the old table or the new, never a mix."""
        self._tokens = [(token.encode(), Role(role)) for token, role in tokens.items()]

    @property
    def trusts_everyone(self) -> bool:
        """Every caller gets full access (no tokens): `require` never refuses."""
        return self._trust_tcp

    def role_of(self, peer: str, metadata: object) -> Role:
        if self._trust_tcp or is_local_peer(peer):
            return Role.ADMIN
        token = bearer_token(metadata)
        if token is None:
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "authorization: bearer token required")
        found: Role | None = None
        candidate = token.encode()
        for known, role in self._tokens:  # no early exit: constant time over the table
            if hmac.compare_digest(known, candidate):
                found = role
        if found is None:
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "authorization: unknown token")
        return found

    def check(self, peer: str, metadata: object, needed: Role) -> Role:
        role = self.role_of(peer, metadata)
        if needed not in _GRANTS[role]:
            raise AuthError(
                grpc.StatusCode.PERMISSION_DENIED,
                f"authorization: role {role.value!r} may not call this ({needed.value} role needed)",
            )
        return role

    async def require(self, context: grpc.aio.ServicerContext, needed: Role) -> Role:
        """Aborts the call with UNAUTHENTICATED / PERMISSION_DENIED when not allowed.

        Runs before every call: a trusted caller (every one when TCP is trusted, else a
        unix socket peer) is let through before the peer address or the metadata is read;
        grpc builds each on request (the metadata costs a few microseconds)."""
        if self._trust_tcp:
            return _ADMIN
        peer = context.peer()
        if is_local_peer(peer):
            return _ADMIN
        try:
            return self.check(peer, context.invocation_metadata(), needed)
        except AuthError as exc:
            await context.abort(exc.code, str(exc))
            raise  # unreachable: abort raises
