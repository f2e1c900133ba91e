"""A stop ends once no call is in flight, even with a frozen peer's connection still open;
a call in flight when the stop begins still gets its reply.

A real grpc.aio server on a unix socket in a temp dir; the "frozen peer" is a raw socket
that spoke HTTP/2's preface and then never reads again, as a SIGSTOPped client: it never
answers the server's GOAWAY, which made `server.stop(grace)` wait the whole grace.
"""

from __future__ import annotations

import asyncio
import socket

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvbudget.daemon.server.in_flight import InFlightCalls, Stopped, stop_server
from kvbudget.daemon.server.malformed import add_checked

GRACE_S = 20.0  # far past anything these tests wait for: reaching it is the failure
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + empty SETTINGS
SETTINGS_ACK = b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"
PING = b"\x00\x00\x08\x06\x00\x00\x00\x00\x00" + b"frozen!!"  # (8 bytes of opaque data)


class HeldHealth(health_pb2_grpc.HealthServicer):
    """Check waits for `release`; "fail" aborts; "cancel" waits for ever (the client cancels)."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def Check(self, request, context):
        if request.service == "fail":
            await context.abort(grpc.StatusCode.NOT_FOUND, "service: fail")
        self.entered.set()
        if request.service == "cancel":
            await asyncio.Event().wait()
        await self.release.wait()
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


async def serve(tmp_path) -> tuple[grpc.aio.Server, InFlightCalls, HeldHealth, str]:
    server = grpc.aio.server()
    calls, servicer = InFlightCalls(), HeldHealth()
    add_checked(health_pb2_grpc.add_HealthServicer_to_server, servicer, server, calls)
    path = tmp_path / "s.sock"
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    return server, calls, servicer, str(path)


def request_headers_only(peer: socket.socket) -> None:
    """A Check call's HEADERS on stream 1, and never its message: a client frozen mid-request.
    (HPACK literals, not indexed, not Huffman-coded.)"""
    fields = ((":method", "POST"), (":scheme", "http"), (":path", "/grpc.health.v1.Health/Check"),
              (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers"))
    block = b"".join(b"\x00" + bytes([len(k)]) + k.encode() + bytes([len(v)]) + v.encode() for k, v in fields)
    peer.sendall(len(block).to_bytes(3, "big") + b"\x01\x04" + (1).to_bytes(4, "big") + block)  # END_HEADERS


def frozen_peer(path: str) -> socket.socket:
    """A connection that opened HTTP/2 (its SETTINGS and the server's acknowledged) and
    then stopped reading or answering. It returns once the server answered its PING: the
    server reads it, so the connection is the server's (its SETTINGS alone go out before
    that, and a stop begun earlier would not wait for it)."""
    peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    peer.connect(path)
    peer.settimeout(30)
    peer.sendall(HTTP2_PREFACE + SETTINGS_ACK + PING)
    while True:  # frames: 9-byte header (length, type, flags, stream), then the payload
        header = _read_exactly(peer, 9)
        payload = _read_exactly(peer, int.from_bytes(header[:3], "big"))
        if header[3:5] == b"\x06\x01" and payload == PING[9:]:  # PING, ACK: our 8 bytes back
            return peer


def _read_exactly(peer: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = peer.recv(size - len(data))
        assert chunk, "the server closed the connection"
        data += chunk
    return data


async def until(condition, what: str) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def test_the_count_follows_calls_that_end_every_way(tmp_path) -> None:
    server, calls, servicer, path = await serve(tmp_path)
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        held = asyncio.ensure_future(stub.Check(health_pb2.HealthCheckRequest()))
        await servicer.entered.wait()
        assert calls.num_in_flight() == 1
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.Check(health_pb2.HealthCheckRequest(service="fail"))
        assert failed.value.code() == grpc.StatusCode.NOT_FOUND
        await until(lambda: calls.num_in_flight() == 1, "an aborted call is counted out")
        servicer.entered.clear()
        cancelled = stub.Check(health_pb2.HealthCheckRequest(service="cancel"))
        waiter = asyncio.ensure_future(cancelled)
        await servicer.entered.wait()
        assert calls.num_in_flight() == 2
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await until(lambda: calls.num_in_flight() == 1, "a call the client cancelled is counted out")
        servicer.release.set()
        assert (await held).status == health_pb2.HealthCheckResponse.SERVING
        await until(lambda: calls.num_in_flight() == 0, "a call answered is counted out")
    await server.stop(0)


async def test_a_frozen_peer_does_not_hold_the_stop_for_the_grace(tmp_path) -> None:
    server, calls, _, path = await serve(tmp_path)
    peer = frozen_peer(path)
    try:
        # Without the cut, this waits GRACE_S: the frozen peer never closes its connection.
        cut_short = await asyncio.wait_for(stop_server(server, calls, GRACE_S), GRACE_S / 2)
        assert cut_short is Stopped.CUT_SHORT
    finally:
        peer.close()


async def test_a_peer_frozen_mid_request_does_not_hold_the_stop(tmp_path) -> None:
    """Its call counts while its request may still arrive (`arriving_s`), then not: grpc
    would have held the stop on it for its own 20 s goodbye timer, or the whole grace."""
    server, calls, _, path = await serve(tmp_path)
    peer = frozen_peer(path)
    try:
        request_headers_only(peer)
        await until(lambda: calls.num_in_flight() == 1, "the call whose request is arriving is counted")
        stopping = stop_server(server, calls, GRACE_S, arriving_s=0.5)
        assert await asyncio.wait_for(stopping, GRACE_S / 2) is Stopped.CUT_SHORT
    finally:
        peer.close()


async def test_with_nobody_connected_the_stop_is_graceful_not_cut(tmp_path) -> None:
    server, calls, _, _ = await serve(tmp_path)
    assert await asyncio.wait_for(stop_server(server, calls, GRACE_S), GRACE_S / 2) is Stopped.GRACEFUL


async def test_a_call_in_flight_gets_its_reply_before_the_stop_cuts_anything(tmp_path) -> None:
    server, calls, servicer, path = await serve(tmp_path)
    peer = frozen_peer(path)
    try:
        async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
            held = asyncio.ensure_future(health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest()))
            await servicer.entered.wait()
            stopping = asyncio.ensure_future(stop_server(server, calls, GRACE_S, settle_s=0.05))
            await asyncio.sleep(0.5)  # ten settles: a stop that ignored the call would be done
            assert not stopping.done() and not held.done(), "the stop must wait for the call in flight"
            servicer.release.set()
            assert (await held).status == health_pb2.HealthCheckResponse.SERVING
            assert await asyncio.wait_for(stopping, GRACE_S / 2) is Stopped.CUT_SHORT  # then the frozen peer is cut
    finally:
        peer.close()
