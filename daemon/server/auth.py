"""Who may call what: unix-socket callers are trusted (the socket's mode is the guard); a
TCP caller needs a role, from a bearer token (compared in constant time) or, with mutual
TLS, from its client certificate's name. A malformed or doubled header is UNAUTHENTICATED.
The credential that let a caller in is its identity (`Caller`): which engine ids it may open
and which sessions it may use (`identity.py`)."""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import grpc

from kvbudget.daemon.server.error_details import abort


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


TRUSTED = "trusted"  # the credential of every unix-socket caller (and of TCP with no tokens file)


@dataclass(frozen=True)
class Caller:
    """Who called: the role, the credential that let it in (`TRUSTED`, `token:<digest>`,
    `certificate:<name>`: never the token itself), and the engine ids it may open (fnmatch
    patterns; None: any, a token listed without `engines`)."""

    role: Role
    credential: str
    engines: tuple[str, ...] | None = None


_TRUSTED_CALLER = Caller(Role.ADMIN, TRUSTED)


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


_SHAPE = "expected one 'authorization: Bearer <token>' header"


def _header_problem(metadata: object) -> str | None:
    """What is wrong with the call's `authorization` headers, if anything: sent twice (which
    one decides would depend on their order, or on a proxy that added one), or not of the
    `Bearer <token>` shape. None: no header, or one well-formed. Never quotes the header:
    it may hold a secret."""
    values = [value for key, value in metadata or () if key.lower() == "authorization"]
    if len(values) > 1:
        return f"authorization: sent {len(values)} times ({_SHAPE})"
    if values and bearer_token(metadata) is None:
        return f"authorization: not a bearer token ({_SHAPE})"
    return None


def is_local_peer(peer: str) -> bool:
    # (gRPC names a unix socket's peer "unix:"; abstract sockets, which have no file mode
    # to guard them, are refused by the config's listen check)
    return peer.startswith("unix:")


class Authorizer:
    """Decides a caller's role from its peer address and metadata."""

    def __init__(
        self, tokens: Mapping[str, str] | None, *, certificate_names: Mapping[str, str] | None = None,
        engines: Mapping[tuple[str, str], tuple[str, ...]] | None = None, trust_tcp: bool = False,
    ) -> None:
        """`trust_tcp`: TCP callers get full access without a token (no tokens file: TLS,
        or mutual TLS, or the explicit allow_insecure_tcp opt-in; the config refuses TCP
        otherwise). `certificate_names`: client certificate name -> role (mutual TLS).
        `engines`: ("token" | "certificate", value) -> the engine ids it may open."""
        self._tokens, self._names = _tables(tokens, certificate_names, engines)
        self._trust_tcp = trust_tcp

    def replace_tokens(self, tokens: Mapping[str, str], certificate_names: Mapping[str, str] | None = None,
                       engines: Mapping[tuple[str, str], tuple[str, ...]] | None = None) -> None:
        """New tokens and certificate names from now on (a reload); calls already let in
        keep going. A call checks against the old tables or the new, never a mix."""
        self._tokens, self._names = _tables(tokens, certificate_names, engines)

    @property
    def trusts_everyone(self) -> bool:
        """Every caller gets full access (no tokens): `require` never refuses."""
        return self._trust_tcp

    def role_of(self, peer: str, metadata: object, peer_names: Iterable[bytes] = ()) -> Role:
        """`peer_names`: the names in the caller's verified client certificate (mutual TLS)."""
        return self.caller_of(peer, metadata, peer_names).role

    def caller_of(self, peer: str, metadata: object, peer_names: Iterable[bytes] = ()) -> Caller:
        if self._trust_tcp or is_local_peer(peer):
            return _TRUSTED_CALLER
        problem = _header_problem(metadata)
        if problem is not None:
            # Refused before a certificate's name is looked at: a credential sent decides,
            # and one that cannot be read is not taken as none sent.
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, problem)
        token = bearer_token(metadata)
        if token is None:
            names = self._names
            for name in peer_names if names else ():
                known = names.get(name)
                if known is not None:
                    return known
            if names:
                raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "authorization: bearer token required "
                                f"(or a client certificate the tokens file's [certificates] names; {_shown(peer_names)})")
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "authorization: bearer token required")
        found: Caller | None = None
        candidate = token.encode()
        for known, caller in self._tokens:  # no early exit: constant time over the table
            if hmac.compare_digest(known, candidate):
                found = caller
        if found is None:
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "authorization: unknown token")
        return found

    def check(self, peer: str, metadata: object, needed: Role, peer_names: Iterable[bytes] = ()) -> Role:
        return self.check_caller(peer, metadata, needed, peer_names).role

    def check_caller(self, peer: str, metadata: object, needed: Role, peer_names: Iterable[bytes] = ()) -> Caller:
        caller = self.caller_of(peer, metadata, peer_names)
        if needed not in _GRANTS[caller.role]:
            raise AuthError(
                grpc.StatusCode.PERMISSION_DENIED,
                f"authorization: role {caller.role.value!r} may not call this ({needed.value} role needed)",
            )
        return caller

    async def require(self, context: grpc.aio.ServicerContext, needed: Role) -> Role:
        return (await self.caller(context, needed)).role

    async def caller(self, context: grpc.aio.ServicerContext, needed: Role) -> Caller:
        """Aborts the call with UNAUTHENTICATED / PERMISSION_DENIED when not allowed.

        Runs before every call: a trusted caller (every one when TCP is trusted, else a
        unix socket peer) is let through before the peer address or the metadata is read;
        grpc builds each on request (the metadata costs a few microseconds)."""
        if self._trust_tcp:
            return _TRUSTED_CALLER
        peer = context.peer()
        if is_local_peer(peer):
            return _TRUSTED_CALLER
        try:
            metadata = context.invocation_metadata()
            # The certificate's names only when they can decide (no token sent): grpc
            # builds the auth context anew on every request for it (~4 us).
            wants_names = self._names and bearer_token(metadata) is None
            names = _certificate_names(context.auth_context()) if wants_names else ()
            return self.check_caller(peer, metadata, needed, names)
        except AuthError as exc:
            await abort(context, exc.code, str(exc))
            raise  # unreachable: abort raises


def _tables(
    tokens: Mapping[str, str] | None, certificate_names: Mapping[str, str] | None,
    engines: Mapping[tuple[str, str], tuple[str, ...]] | None,
) -> tuple[list[tuple[bytes, Caller]], dict[bytes, Caller]]:
    """The callers each token and certificate name (bytes: as gRPC's auth context gives
    them) lets in. A token's credential is a digest of it: sessions keep it, never the token."""
    engines = engines or {}
    by_token = [
        (token.encode(), Caller(Role(role), "token:" + hashlib.sha256(token.encode()).hexdigest()[:16],
                                engines.get(("token", token))))
        for token, role in (tokens or {}).items()
    ]
    by_name = {
        name.encode(): Caller(Role(role), f"certificate:{name}", engines.get(("certificate", name)))
        for name, role in (certificate_names or {}).items()
    }
    return by_token, by_name


def _certificate_names(auth_context: Mapping[str, Iterable[bytes]]) -> list[bytes]:
    """The names of the caller's verified client certificate: subject CN, then every
    subject alternative name (DNS, URI, IP, e-mail); none without mutual TLS."""
    return [*auth_context.get("x509_common_name", ()), *auth_context.get("x509_subject_alternative_name", ())]


def _shown(peer_names: Iterable[bytes]) -> str:
    names = sorted({name.decode(errors="replace") for name in peer_names})
    return f"this one names {', '.join(names)}" if names else "this call presented none"
