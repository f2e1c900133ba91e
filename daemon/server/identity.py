"""An engine's identity is the credential that opened its session (issue 30): a token or
certificate name may open only the engine ids the tokens file lists for it, may replace
only a session it opened itself, and only it may use that session (Step, Events,
Heartbeat, CloseSession). Without this, any engine token could evict another engine or
finish its requests with its session id.

Unix-socket callers are trusted (`auth.TRUSTED`: the socket's file mode is the boundary,
as for every other call): they may open, replace and use any session, as an admin-role
credential may (the operator's, who may drain the daemon anyway). Peer credentials
(SO_PEERCRED) may tell local engines apart later."""

from __future__ import annotations

from fnmatch import fnmatchcase

from kvbudget.daemon.server.auth import TRUSTED, Caller, Role
from kvbudget.daemon.server.refusal import Refused, Status
from kvbudget.daemon.server.sessions import Session


def check_may_open(caller: Caller, engine_id: str, existing: Session | None, replace_existing: bool,
                   lease_now: float) -> None:
    """Refused (PERMISSION_DENIED, naming the field) unless `caller` may open `engine_id`
    and, when it asks to end the live session of that id, opened that one itself. (A lapsed
    session is dead already: the next tick expires it whoever reopens the id.)"""
    if caller.engines is not None and not any(fnmatchcase(engine_id, p) for p in caller.engines):
        raise Refused(Status.PERMISSION_DENIED,
                      f"engine_id: {engine_id!r} is not among the engine ids this credential may open "
                      f"(the tokens file's engines = [{', '.join(repr(p) for p in caller.engines)}])")
    if (existing is not None and replace_existing and existing.expires_at > lease_now
            and not owns(caller, existing)):
        raise Refused(Status.PERMISSION_DENIED,
                      f"replace_existing: the live session of {engine_id!r} was opened with another credential")


def check_owner(caller: Caller, session: Session | None) -> None:
    """Refused unless `caller` opened `session` (None: the call names no live session,
    and is refused as such further on)."""
    if session is not None and not owns(caller, session):
        raise Refused(Status.PERMISSION_DENIED,
                      "session_id: this session was opened with another credential")


def owns(caller: Caller, session: Session) -> bool:
    return caller.credential == session.owner or caller.credential == TRUSTED or caller.role is Role.ADMIN
