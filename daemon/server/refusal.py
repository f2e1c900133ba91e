"""A call the service refuses: what went wrong, in words the edge turns into a gRPC status.

The service object decides; the servicers only map `Refused.status` to the status code of
the same name. Nothing was applied, unless the message says so.
"""

from __future__ import annotations

import enum

from kvbudget.daemon.core.validation import Problem, StepRejected


class Status(enum.Enum):
    """The statuses the service answers with (named as gRPC's)."""

    INVALID_ARGUMENT = "invalid_argument"
    NOT_FOUND = "not_found"
    ALREADY_EXISTS = "already_exists"
    FAILED_PRECONDITION = "failed_precondition"
    PERMISSION_DENIED = "permission_denied"  # (identity.py: a credential using what is not its own)
    RESOURCE_EXHAUSTED = "resource_exhausted"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


class Refused(Exception):
    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


_OF_PROBLEM = {
    Problem.INVALID: Status.INVALID_ARGUMENT,
    Problem.DUPLICATE: Status.ALREADY_EXISTS,
    Problem.NOT_OWNED: Status.NOT_FOUND,
}


def rejected(problem: StepRejected) -> Refused:
    """A core validation problem as the call's refusal ("grows[2].num_tokens: ...")."""
    return Refused(_OF_PROBLEM[problem.kind], str(problem))


def invalid(message: str) -> Refused:
    return Refused(Status.INVALID_ARGUMENT, message)
