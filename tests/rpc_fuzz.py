"""A seeded fuzz of the daemon's RPCs (issue 30, point 8), shared by tests/test_trust_fuzz.py
(a few thousand calls) and bench/fuzz_rpcs.py (as many as asked).

Each call is drawn from a seeded generator: a valid step (submits, grows to the request's
length, finishes, aborts) of one of a few engines, or a step or call with exactly one fault
whose status code and field the generator knows (an unknown id: NOT_FOUND; a duplicate
submit: ALREADY_EXISTS; a bad number or id, too many ops: INVALID_ARGUMENT; an unknown
session or a step number below the last: FAILED_PRECONDITION), a resend of the last step
(the same reply, nothing applied twice), sessions opened, replaced and closed, heartbeats,
snapshots and estimates. Every outcome is checked as it comes; `check_pool_and_log` checks
the daemon's pool against its log afterwards (and whenever the caller wants).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field

import grpc

from kvbudget.v1 import engine_pb2, engine_pb2_grpc, observer_pb2, observer_pb2_grpc

OK = grpc.StatusCode.OK
RUNNING_KINDS = frozenset({"admit", "grow", "deny", "reclaim"})
WAITING_KINDS = frozenset({"queue", "preempt"})
ENDING_KINDS = frozenset({"reject", "release", "expire"})


class FuzzFailure(AssertionError):
    pass


@dataclass
class Engine:
    session_id: str = ""
    applied_seq: int = 0  # the last numbered step the daemon applied
    next_seq: int = 0
    live: dict[str, int] = field(default_factory=dict)  # request id -> its length (prompt + max_new)
    last_request: engine_pb2.StepRequest | None = None
    last_reply: engine_pb2.StepResponse | None = None


class RpcFuzz:
    def __init__(self, target: str, seed: int, *, num_engines: int = 4, max_ops_per_step: int = 64) -> None:
        self.rng = random.Random(seed)
        self._channel = grpc.aio.insecure_channel(target)
        self.engine = engine_pb2_grpc.EngineServiceStub(self._channel)
        self.observer = observer_pb2_grpc.ObserverServiceStub(self._channel)
        self.engines = {f"fuzz-{i}": Engine() for i in range(num_engines)}
        self.max_ops = max_ops_per_step
        self.told: dict[int, tuple[str, str]] = {}  # seq -> (kind, request_id) of every decision a reply carried
        self.never_applied: set[str] = set()  # ids submitted only in refused steps
        self.applied: set[str] = set()  # ids submitted in applied steps
        self.outcomes: Counter[str] = Counter()  # "Step OK", "Step NOT_FOUND", ...
        self.calls = 0
        self.skipped = 0  # calls drawn that sent nothing (a resend before any step)
        self._ids = 0

    async def close(self) -> None:
        await self._channel.close()

    def _new_id(self) -> str:
        self._ids += 1
        return f"q{self._ids}"

    # ------------------------------------------------------------------ one call
    async def run(self, num_calls: int, after_each=None) -> None:
        """`after_each()`, if given, runs once each call's reply (or refusal) is in: a
        daemon in the same process checks its pool there (tests/test_trust_fuzz.py)."""
        for _ in range(num_calls):
            await self.one_call()
            if after_each is not None:
                after_each()

    async def one_call(self) -> None:
        self.calls += 1
        name, engine = self.rng.choice(sorted(self.engines.items()))
        if not engine.session_id:
            await self._open(name, engine, replace=False)
            return
        roll = self.rng.random()
        if roll < 0.55:
            await self._valid_step(engine)
        elif roll < 0.85:
            await self._faulty_step(engine)
        elif roll < 0.88:
            await self._resend(engine)
        else:
            await self._other_call(name, engine)

    async def _expect(self, rpc: str, call, expected: grpc.StatusCode, field_prefix: str = ""):
        try:
            reply = await call
        except grpc.aio.AioRpcError as error:
            self.outcomes[f"{rpc} {error.code().name}"] += 1
            if error.code() != expected or not (error.details() or "").startswith(field_prefix):
                raise FuzzFailure(f"call {self.calls}: {rpc} got {error.code().name} {error.details()!r}, "
                                  f"expected {expected.name} {field_prefix!r}") from None
            return None
        self.outcomes[f"{rpc} OK"] += 1
        if expected != OK:
            raise FuzzFailure(f"call {self.calls}: {rpc} succeeded, expected {expected.name} {field_prefix!r}")
        return reply

    # ------------------------------------------------------------------ steps
    def _valid_ops(self, engine: Engine) -> engine_pb2.StepRequest:
        rng, request = self.rng, engine_pb2.StepRequest()
        live = list(engine.live)
        rng.shuffle(live)
        ends = live[: rng.randint(0, min(3, len(live)))]
        for request_id in ends:
            (request.finishes if rng.random() < 0.5 else request.aborts).add(request_id=request_id)
        for request_id in live[len(ends): len(ends) + rng.randint(0, 3)]:
            request.grows.add(request_id=request_id, num_tokens=engine.live[request_id])
        for _ in range(rng.randint(0, 3)):
            request.submits.add(request_id=self._new_id(), prompt_tokens=rng.randint(1, 64),
                                max_new_tokens=rng.randint(1, 64), priority=rng.randint(-1, 1))
        return request

    async def _step(self, engine: Engine, request: engine_pb2.StepRequest, expected=OK, field_prefix=""):
        request.session_id = request.session_id or engine.session_id
        if not request.step_seq:
            engine.next_seq = max(engine.next_seq, engine.applied_seq) + 1
            request.step_seq = engine.next_seq
        reply = await self._expect("Step", self.engine.Step(request), expected, field_prefix)
        if reply is None:
            self.never_applied.update(s.request_id for s in request.submits if s.request_id not in self.applied)
            return None
        engine.applied_seq, engine.last_request, engine.last_reply = request.step_seq, request, reply
        for submit in request.submits:
            self.applied.add(submit.request_id)
            engine.live[submit.request_id] = submit.prompt_tokens + submit.max_new_tokens
        for end in (*request.finishes, *request.aborts):
            engine.live.pop(end.request_id, None)
        for d in reply.decisions:
            self.told[d.seq] = (common_kind(d), d.request_id)
            if common_kind(d) in ENDING_KINDS:
                engine.live.pop(d.request_id, None)
        return reply

    async def _valid_step(self, engine: Engine) -> None:
        await self._step(engine, self._valid_ops(engine))

    async def _faulty_step(self, engine: Engine) -> None:
        """A valid step with one fault added, of a kind the engine's state allows."""
        rng, request = self.rng, self._valid_ops(engine)
        used = {op.request_id for ops in (request.finishes, request.aborts, request.grows) for op in ops}
        spare = [r for r in engine.live if r not in used]
        faults = ["unknown_finish", "unknown_grow", "bad_prompt", "empty_id", "long_id", "bad_max_new",
                  "unknown_session", "too_many"]
        if spare:
            faults += ["end_twice", "grow_past_length", "duplicate_submit"]
        if engine.applied_seq >= 2:
            faults.append("seq_below")
        fault = rng.choice(faults)
        if fault == "unknown_finish":
            request.finishes.add(request_id=f"nope{self.calls}")
            expected, prefix = grpc.StatusCode.NOT_FOUND, f"finishes[{len(request.finishes) - 1}].request_id"
        elif fault == "unknown_grow":
            request.grows.add(request_id=f"nope{self.calls}", num_tokens=16)
            expected, prefix = grpc.StatusCode.NOT_FOUND, f"grows[{len(request.grows) - 1}].request_id"
        elif fault == "end_twice":
            request.finishes.add(request_id=spare[0])
            request.aborts.add(request_id=spare[0])
            expected, prefix = grpc.StatusCode.INVALID_ARGUMENT, f"aborts[{len(request.aborts) - 1}].request_id"
        elif fault == "grow_past_length":
            request.grows.add(request_id=spare[0], num_tokens=engine.live[spare[0]] + rng.randint(1, 4096))
            expected, prefix = grpc.StatusCode.INVALID_ARGUMENT, f"grows[{len(request.grows) - 1}].num_tokens"
        elif fault == "duplicate_submit":
            request.submits.add(request_id=spare[0], prompt_tokens=16, max_new_tokens=16)
            expected, prefix = grpc.StatusCode.ALREADY_EXISTS, f"submits[{len(request.submits) - 1}].request_id"
        elif fault in ("bad_prompt", "empty_id", "long_id", "bad_max_new"):
            request_id = {"empty_id": "", "long_id": "x" * rng.randint(257, 5000)}.get(fault, self._new_id())
            submit = request.submits.add(request_id=request_id, prompt_tokens=0 if fault == "bad_prompt" else 8)
            if fault == "bad_max_new":
                submit.max_new_tokens = 0
            what = {"bad_prompt": "prompt_tokens", "bad_max_new": "max_new_tokens"}.get(fault, "request_id")
            expected, prefix = grpc.StatusCode.INVALID_ARGUMENT, f"submits[{len(request.submits) - 1}].{what}"
        elif fault == "unknown_session":
            request.session_id = f"{rng.getrandbits(128):032x}"
            expected, prefix = grpc.StatusCode.FAILED_PRECONDITION, "session_id"
        elif fault == "too_many":
            for _ in range(self.max_ops + 1 - len(request.finishes) - len(request.aborts) - len(request.grows)
                           - len(request.submits)):
                request.submits.add(request_id=self._new_id(), prompt_tokens=1)
            expected, prefix = grpc.StatusCode.INVALID_ARGUMENT, "submits: at most"
        else:  # seq_below
            request.step_seq = engine.applied_seq - 1
            expected, prefix = grpc.StatusCode.FAILED_PRECONDITION, "step_seq"
        await self._step(engine, request, expected, prefix)

    async def _resend(self, engine: Engine) -> None:
        """The last applied step sent again: the same reply, nothing applied twice."""
        if engine.last_request is None:
            self.skipped += 1
            return
        reply = await self._expect("Step", self.engine.Step(engine.last_request), OK)
        if reply != engine.last_reply:
            raise FuzzFailure(f"call {self.calls}: a resend of step {engine.applied_seq} got another reply")

    # ------------------------------------------------------------------ other calls
    async def _open(self, name: str, engine: Engine, *, replace: bool) -> None:
        reply = await self._expect("OpenSession", self.engine.OpenSession(
            engine_pb2.OpenSessionRequest(engine_id=name, lease_ttl_s=3600, replace_existing=replace)), OK)
        engine.session_id, engine.applied_seq, engine.next_seq = reply.session_id, 0, 0
        engine.live.clear()  # (a replaced session's requests are expired)
        engine.last_request = engine.last_reply = None

    async def _other_call(self, name: str, engine: Engine) -> None:
        rng = self.rng
        kind = rng.choice(["reopen", "replace", "close", "heartbeat", "bad_heartbeat", "bad_engine_id",
                           "snapshot", "estimate", "bad_estimate"])
        E, O = engine_pb2, observer_pb2
        if kind == "reopen":
            await self._expect("OpenSession", self.engine.OpenSession(E.OpenSessionRequest(engine_id=name)),
                               grpc.StatusCode.ALREADY_EXISTS, "engine_id")
        elif kind == "replace":
            await self._open(name, engine, replace=True)
        elif kind == "close":
            await self._expect("CloseSession", self.engine.CloseSession(
                E.CloseSessionRequest(session_id=engine.session_id)), OK)
            engine.session_id = ""
            engine.live.clear()
        elif kind == "heartbeat":
            await self._expect("Heartbeat", self.engine.Heartbeat(E.HeartbeatRequest(session_id=engine.session_id)), OK)
        elif kind == "bad_heartbeat":
            await self._expect("Heartbeat", self.engine.Heartbeat(E.HeartbeatRequest(session_id="0" * 32)),
                               grpc.StatusCode.FAILED_PRECONDITION, "session_id")
        elif kind == "bad_engine_id":
            bad = rng.choice(["", "\x00bad", "e" * 300])
            await self._expect("OpenSession", self.engine.OpenSession(E.OpenSessionRequest(engine_id=bad)),
                               grpc.StatusCode.INVALID_ARGUMENT, "engine_id")
        elif kind == "snapshot":
            await self._expect("GetSnapshot", self.observer.GetSnapshot(O.GetSnapshotRequest()), OK)
        elif kind == "estimate":
            await self._expect("Estimate", self.observer.Estimate(
                O.EstimateRequest(tokens_per_request=rng.randint(1, 1 << 24))), OK)
        else:
            tokens = rng.choice([0, (1 << 24) + rng.randint(1, 1 << 20)])
            await self._expect("Estimate", self.observer.Estimate(O.EstimateRequest(tokens_per_request=tokens)),
                               grpc.StatusCode.INVALID_ARGUMENT, "tokens_per_request")

    # ------------------------------------------------------------------ after
    async def check_pool_and_log(self, rows: list[dict]) -> None:
        """The daemon's snapshot against its log (`rows`: every row, read after the snapshot
        with no call in between), and every decision a reply carried against the log."""
        snapshot = (await self.observer.GetSnapshot(observer_pb2.GetSnapshotRequest())).snapshot
        failures = pool_and_log_failures(snapshot, rows, self.told, self.never_applied)
        if failures:
            raise FuzzFailure("; ".join(failures[:10]))


def common_kind(decision) -> str:
    from kvbudget.v1 import common_pb2

    return common_pb2.DecisionKind.Name(decision.kind).removeprefix("DECISION_KIND_").lower()


def pool_and_log_failures(snapshot, rows: list[dict], told: dict[int, tuple[str, str]],
                          never_applied: set[str]) -> list[str]:
    failures: list[str] = []
    seqs = [row["seq"] for row in rows]
    if sorted(seqs) != list(range(1, len(rows) + 1)):
        failures.append("the log's seqs are not 1..N, each once")
    by_seq = {row["seq"]: (row["kind"], row["request_id"]) for row in rows}
    lost = [seq for seq, what in told.items() if by_seq.get(seq) != what]
    if lost:
        failures.append(f"{len(lost)} decisions told to an engine are not in the log as told (seq {lost[:5]})")
    ghosts = never_applied & {row["request_id"] for row in rows}
    if ghosts:
        failures.append(f"requests only in refused steps are in the log: {sorted(ghosts)[:5]}")
    last: dict[str, dict] = {}
    for row in sorted(rows, key=lambda r: r["seq"]):
        if row["request_id"]:
            last[row["request_id"]] = row
    # (a deny `not_running`: a grow of a request that waits)
    waits = [r["kind"] in WAITING_KINDS or (r["kind"], r["reason"]) == ("deny", "not_running") for r in last.values()]
    running = [r for r, w in zip(last.values(), waits) if not w and r["kind"] in RUNNING_KINDS]
    waiting = [r for r, w in zip(last.values(), waits) if w]
    held = sum(sum(json.loads(r["blocks_held"])) for r in running)
    figures = {
        "num_running": (snapshot.num_running, len(running)),
        "num_waiting": (snapshot.num_waiting, len(waiting)),
        "num_held_blocks": (snapshot.num_held_blocks, held),
        "free + held": (snapshot.num_free_blocks + snapshot.num_held_blocks, snapshot.num_blocks),
        "decisions_by_kind": (dict(snapshot.decisions_by_kind), dict(Counter(row["kind"] for row in rows))),
    }
    failures += [f"{name}: the daemon says {daemon}, the log {log}" for name, (daemon, log) in figures.items()
                 if daemon != log]
    return failures
