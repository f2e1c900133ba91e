"""AskAdmission: a router's question read from its message and answered by the core's
`outlook` on the live controller, which it changes in nothing (docs/routing.md).

Its own module: service.py is full, and the servicer stays a thin adapter.
"""

from __future__ import annotations

import math

from kvbudget.daemon.core.admission import AdmissionController, AdmissionError
from kvbudget.daemon.core.records import MAX_TENANT_CHARS
from kvbudget.daemon.core.outlook import DEFAULT_STEP_S, Shape, outlook
from kvbudget.daemon.server.refusal import invalid
from kvbudget.v1 import observer_pb2


def ask_admission(
    controller: AdmissionController, request: observer_pb2.AskAdmissionRequest, now: float
) -> observer_pb2.AskAdmissionResponse:
    """Raises Refused (INVALID_ARGUMENT naming the field) for a bad question."""
    if request.prompt_tokens < 1:
        raise invalid("prompt_tokens: at least 1, got 0")
    if not math.isfinite(request.step_s) or request.step_s < 0:
        raise invalid(f"step_s: a finite number of seconds >= 0 (0: {DEFAULT_STEP_S}), got {request.step_s}")
    if len(request.tenant) > MAX_TENANT_CHARS or not request.tenant.isprintable():
        raise invalid(f"tenant: printable, at most {MAX_TENANT_CHARS} characters")
    full_blocks = request.prompt_tokens // controller.layout.block_size
    if len(request.prefix_hashes) > full_blocks:
        raise invalid(
            f"prefix_hashes: {len(request.prefix_hashes)} hashes but the prompt has only {full_blocks} full blocks"
        )
    shape = Shape(
        prompt_tokens=request.prompt_tokens,
        max_new_tokens=request.max_new_tokens if request.HasField("max_new_tokens") else None,
        tenant=request.tenant,
        priority=request.priority,
        prefix_hashes=tuple(request.prefix_hashes),
    )
    try:
        answer = outlook(controller, shape, now, request.step_s or DEFAULT_STEP_S)
    except AdmissionError as error:
        raise invalid(str(error)) from None
    return observer_pb2.AskAdmissionResponse(
        admit_now=answer.admit_now, reason=answer.reason, final=answer.final,
        blocks_needed=answer.blocks_needed, blocks_needed_total=answer.blocks_needed_total,
        blocks_free=answer.blocks_free, blocks_spare=max(answer.blocks_spare, 0),
        blocks_reclaimable=answer.blocks_reclaimable, requests_ahead=answer.requests_ahead,
        blocks_ahead=answer.blocks_ahead, wait_steps=answer.wait_steps, wait_s=answer.wait_s,
        detail=answer.detail,
    )  # fmt: skip
