"""The backends a simulation asks for admission, one call per engine step.

`Backend` is admission in-process (offline replay); `AsyncBackend` is its awaitable twin
(the daemon over gRPC). Both take a whole step's asks in one call, as the core's `StepOps`.
"""

from __future__ import annotations

from typing import Protocol

from kvbudget.daemon.core.records import Decision
from kvbudget.daemon.core.spec import KVCacheLayout
from kvbudget.daemon.core.step import StepOps


class Backend(Protocol):
    """Where admission happens, in-process (offline). `AsyncBackend` is the gRPC twin."""

    layout: KVCacheLayout
    num_blocks: int  # usable blocks

    def open_engine(self, engine_id: str) -> None: ...

    def step(self, engine_id: str, ops: StepOps, now: float) -> list[Decision]:
        """Apply the ops (finishes, aborts, progress, grows, submits, in that order) and
        return every decision that caused, for any engine's requests."""
        ...

    def poll(self, engine_id: str, now: float) -> list[Decision]:
        """Decisions that reached this engine outside its own calls."""
        ...

    def idle(self, engine_id: str, now: float) -> list[Decision]:
        """The engine ran nothing and has requests waiting: look at the queue again
        (the daemon does this on its own; the in-process core needs asking)."""
        ...

    def num_free_blocks(self) -> int: ...


class AsyncBackend(Protocol):
    layout: KVCacheLayout
    num_blocks: int

    async def open_engine(self, engine_id: str) -> None: ...

    async def step(self, engine_id: str, ops: StepOps, now: float) -> list[Decision]: ...

    async def poll(self, engine_id: str, now: float) -> list[Decision]:
        """Also where pacing happens: return no earlier than virtual time `now` allows."""
        ...

    async def idle(self, engine_id: str, now: float) -> list[Decision]:
        """Like poll, but wait a little for the daemon to admit something on its own."""
        ...

    def num_free_blocks(self) -> int: ...
