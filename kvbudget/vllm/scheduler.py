"""`kvbudget.vllm.Scheduler`: vLLM 0.33's v1 Scheduler, admitting, growing and preempting as
the KVBudget daemon decides. Select it with `vllm serve ... --scheduler-cls
kvbudget.vllm.Scheduler --no-async-scheduling`; settings come from KVBUDGET_* variables
(docs/vllm.md). Every hook calls vLLM's own method and tells the adapter around it.
"""

from __future__ import annotations

from vllm.outputs import RequestError
from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler
from vllm.v1.request import RequestStatus

from kvbudget.vllm.adapter import Adapter
from kvbudget.vllm.settings import read_settings

ASYNC_REFUSED = (
    "kvbudget.vllm.Scheduler does not support async scheduling (scheduler_config.async_scheduling): "
    "each step's admissions come from the daemon before the step is built. Start vLLM with "
    "--no-async-scheduling"
)

# Ends the daemon hears as an abort; the others (stop, length, repetition) are a finish.
_ABORTED = (RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR, RequestStatus.FINISHED_IGNORED)


class Scheduler(VllmScheduler):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.scheduler_config.async_scheduling:
            raise ValueError(ASYNC_REFUSED)
        self.kvbudget = Adapter(self, read_settings())

    def add_request(self, request) -> None:
        new = request.request_id not in self.requests
        super().add_request(request)
        if new:
            self.kvbudget.arrived(request)

    def schedule(self, *args, **kwargs):
        gate = self.kvbudget.before()
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            gate.restore()
        self.kvbudget.after(output)
        return output

    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        self.kvbudget.outputs(outputs)
        return outputs

    def finish_requests(self, request_ids, finished_status: RequestStatus):
        finished = super().finish_requests(request_ids, finished_status)
        self.kvbudget.ended(finished, aborted=finished_status in _ABORTED)
        return finished

    def kvbudget_reject(self, request_id: str, message: str) -> None:
        """Finishes a request the daemon rejected with an error its API client sees: the
        next update_from_output finishes these with FINISHED_ERROR (vLLM's own path for a
        request that cannot run) and sends the message."""
        self.grammar_compile_error_reqs[request_id] = RequestError(code="kvbudget_rejected", message=message)

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            self.kvbudget.close()
