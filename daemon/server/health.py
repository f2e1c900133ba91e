"""The standard gRPC health service, as the daemon serves it: every service's status listed,
and watches that end when the daemon stops."""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from kvbudget.v1 import admin_pb2, engine_pb2, observer_pb2

SERVICE_NAMES = (
    engine_pb2.DESCRIPTOR.services_by_name["EngineService"].full_name,
    observer_pb2.DESCRIPTOR.services_by_name["ObserverService"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
)


class Health(health_aio.HealthServicer):
    """The standard health service, with `List` too (the asyncio servicer of
    grpcio-health-checking leaves it UNIMPLEMENTED though reflection lists it): every
    service's status, as `Check` would answer each."""

    def __init__(self) -> None:
        super().__init__()
        self._statuses: dict[str, int] = {"": health_pb2.HealthCheckResponse.SERVING}
        self._ending = asyncio.Event()

    async def Watch(self, request, context):
        """The standard Watch, ended (OK) once the daemon stops: the standard one never
        returns, so a client watching health (gRPC's client-side health checking does) held
        a stop for the whole drain_timeout_s."""
        watching = asyncio.ensure_future(super().Watch(request, context))
        ending = asyncio.ensure_future(self._ending.wait())
        try:
            await asyncio.wait((watching, ending), return_when=asyncio.FIRST_COMPLETED)
        finally:
            ending.cancel()
            if not watching.done():
                watching.cancel()
        if watching.done() and not watching.cancelled():
            return watching.result()  # (it ended on its own: an error writing, say)
        # Ending: the stream closes, OK. (No last status written here: the stop set NOT_SERVING
        # first, which the watch wrote; a write of ours could meet one of its still pending.)

    def end_watches(self) -> None:
        """Every Watch stream ends, now and from now on."""
        self._ending.set()

    async def set(self, service: str, status: int) -> None:
        self._statuses[service] = status
        await super().set(service, status)

    async def set_serving(self, serving: bool) -> None:
        """SERVING or NOT_SERVING, for the whole server and each of the daemon's services."""
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *SERVICE_NAMES):
            await self.set(name, status)

    async def List(self, request, context):
        return health_pb2.HealthListResponse(
            statuses={name: health_pb2.HealthCheckResponse(status=status) for name, status in self._statuses.items()}
        )
