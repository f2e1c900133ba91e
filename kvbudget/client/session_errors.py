"""What an engine's step raises besides the daemon's own refusals (grpc errors)."""

from __future__ import annotations


class SessionLost(Exception):
    """The daemon forgot this engine's session; a new one is open, requests must be resent."""


class ClientClosed(RuntimeError):
    """A step on a closed EngineClient, or one in flight when close() was called (whether
    the daemon applied that one is unknown; close() released the session's requests)."""
