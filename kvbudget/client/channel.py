"""The asyncio channel the engine and observer clients open (the CLI's blocking one is
`target.channel`)."""

from __future__ import annotations

import asyncio

import grpc


# Shared with a blocking channel to the same daemon (the vLLM adapter's Steps).
CHANNEL_OPTIONS = (("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20))


def open_channel(target: str, credentials: grpc.ChannelCredentials | None) -> grpc.aio.Channel:
    options = list(CHANNEL_OPTIONS)
    if credentials is not None:
        return grpc.aio.secure_channel(target, credentials, options=options)
    return grpc.aio.insecure_channel(target, options=options)


def task_cancelling() -> bool:
    """Whether the running task itself is being cancelled (not just a call it awaits)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
