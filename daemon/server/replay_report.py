"""A replay's report (ReportReplay) checked before it is kept for the snapshot."""

from __future__ import annotations

import math

from kvbudget.daemon.core.validation import StepRejected, check_request_id
from kvbudget.daemon.server.refusal import invalid, rejected
from kvbudget.v1 import common_pb2

MAX_REPLAY_TEXT = 512  # a trace's name (a file name is at most 255 bytes)


def check_replay(replay: common_pb2.ReplayState) -> None:
    """Raises Refused (INVALID_ARGUMENT, naming the field) for a report not to keep."""
    try:
        check_request_id("replay.replay_id", replay.replay_id)
    except StepRejected as problem:
        raise rejected(problem) from None
    if replay.total and replay.position > replay.total:
        raise invalid("replay.position: beyond replay.total")
    # Every snapshot and Watch update carries each replay: a 5 MB trace name broke every
    # observer on gRPC's 4 MB default, and 64 of them the daemon's own 64 MiB limit.
    for field, text, limit in (("replay.trace", replay.trace, MAX_REPLAY_TEXT), ("replay.policy", replay.policy, 64)):
        if len(text) > limit or not text.isprintable():
            raise invalid(f"{field}: printable text, at most {limit} characters")
    if not (math.isfinite(replay.speed) and replay.speed >= 0):
        raise invalid(f"replay.speed: a finite number >= 0 (0: as fast as possible), got {replay.speed}")
