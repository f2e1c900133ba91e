"""One scheduler step's operations, sent as one Step by `flush()` (the EngineClient's
`batch()`); what a failed flush keeps: docs/engine-integration.md, "Handling what a step raises".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvbudget.client.session_errors import SessionLost
from kvbudget.daemon.core.records import Decision, RequestSpec
from kvbudget.v1 import engine_pb2

if TYPE_CHECKING:
    from kvbudget.client.engine import EngineClient


class StepBatch:
    """Accumulates one scheduler step's operations; `flush()` sends them as one Step.

    A flush that raises leaves its ops in the batch (ahead of any added meanwhile), so the
    engine can send the same step again (what UNAVAILABLE "decision log: ..." asks for) or
    take out the op that was refused: a refused step applied nothing, and its submits must
    not be forgotten. Only `SessionLost` empties it: its ops were for the lost session.
    One refusal comes after the step was applied: RESOURCE_EXHAUSTED "this step was applied
    and logged" (its reply was too large; its decisions come on Events): `clear()` then.
    """

    def __init__(self, client: EngineClient) -> None:
        self._client = client
        self.clear()

    def clear(self) -> None:
        self.submits: list[RequestSpec | engine_pb2.Submit] = []
        self.grows: list[tuple[str, int]] = []
        self.progress: list[tuple[str, int]] = []
        self.finishes: list[str] = []
        self.aborts: list[str] = []

    def submit(self, spec: RequestSpec | engine_pb2.Submit) -> None:
        self.submits.append(spec)

    def grow(self, request_id: str, num_tokens: int) -> None:
        self.grows.append((request_id, num_tokens))

    def report_progress(self, request_id: str, num_computed_tokens: int) -> None:
        self.progress.append((request_id, num_computed_tokens))

    def finish(self, request_id: str) -> None:
        self.finishes.append(request_id)

    def abort(self, request_id: str) -> None:
        self.aborts.append(request_id)

    def __len__(self) -> int:
        return len(self.submits) + len(self.grows) + len(self.progress) + len(self.finishes) + len(self.aborts)

    async def flush(self) -> list[Decision]:
        """Sends the ops as one Step (an empty one too: it renews the lease and is how an
        idle engine hears `SessionLost`); returns this engine's decisions, in order."""
        ops = (self.submits, self.grows, self.progress, self.finishes, self.aborts)
        self.clear()  # ops added while the step is in flight belong to the next one
        try:
            return await self._client.step(*ops)
        except SessionLost:
            raise
        except Exception:  # (not a cancellation: whether that step was applied is unknown)
            self._put_back(*ops)
            raise

    def _put_back(
        self,
        submits: list[RequestSpec | engine_pb2.Submit],
        grows: list[tuple[str, int]],
        progress: list[tuple[str, int]],
        finishes: list[str],
        aborts: list[str],
    ) -> None:
        self.submits[:0] = submits
        self.grows[:0] = grows
        self.progress[:0] = progress
        self.finishes[:0] = finishes
        self.aborts[:0] = aborts
