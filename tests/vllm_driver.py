"""vLLM's real v1 scheduler on CPU with no model, for the adapter's tests and bench.

`build_scheduler` makes a `kvbudget.vllm.Scheduler` (or vLLM's own) over a full-attention
model config with exactly `num_gpu_blocks` KV blocks; `drive` plays trace rows through it on
a simulated clock, fabricating each step's model output (one token per request that
finished its prompt; a stop token once a request reached its trace output length), and
returns the figures a replay reports. Written for this project, from vLLM's interfaces.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

PRESETS = Path(__file__).resolve().parent.parent / "daemon" / "config" / "presets"
SAMPLED, STOP = 7, 2


def model_dir(tmp: Path, preset: str = "llama-3.1-8b") -> Path:
    config = json.loads((PRESETS / f"{preset}.json").read_text())
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    config.setdefault("torch_dtype", "bfloat16")
    folder = tmp / preset
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def build_scheduler(model: Path, num_gpu_blocks: int, *, cls=None, max_model_len: int = 4096,
                    max_num_seqs: int = 256, max_num_batched_tokens: int = 8192, prefix_caching: bool = False,
                    block_size: int = 16, sliding_window: int | None = None, hybrid: bool = False):
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
    from vllm.v1.structured_output import StructuredOutputManager

    if cls is None:
        from kvbudget.vllm import Scheduler as cls
    model_config = ModelConfig(model=str(model), skip_tokenizer_init=True, dtype="bfloat16", seed=0,
                               max_model_len=max_model_len)
    scheduler_config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                       max_model_len=max_model_len, enable_chunked_prefill=True,
                                       is_encoder_decoder=False, async_scheduling=False)
    cache_config = CacheConfig(block_size=block_size, enable_prefix_caching=prefix_caching,
                               num_gpu_blocks_override=num_gpu_blocks)
    config = VllmConfig(model_config=model_config, scheduler_config=scheduler_config, cache_config=cache_config,
                        device_config=DeviceConfig(device="cpu"))
    hf = model_config.hf_text_config
    head = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    register_all_kvcache_specs(config)
    shape = dict(block_size=block_size, num_kv_heads=hf.num_key_value_heads, head_size=head, dtype=torch.bfloat16)
    full = FullAttentionSpec(**shape)
    window = SlidingWindowSpec(**shape, sliding_window=sliding_window) if sliding_window else None
    layers = [f"model.layers.{i}.self_attn.attn" for i in range(hf.num_hidden_layers)]
    # One group (full attention, or all layers in one window), or with `hybrid` the
    # even layers in a window and the odd ones full, in the daemon's group order (windowed
    # first). The scheduler never touches the tensors.
    if hybrid:
        groups = [KVCacheGroupSpec(layers[0::2], window), KVCacheGroupSpec(layers[1::2], full)]
        config.scheduler_config.disable_hybrid_kv_cache_manager = False  # (the CPU platform turns it off)
    else:
        groups = [KVCacheGroupSpec(layers, window or full)]
    kv_config = KVCacheConfig(num_blocks=num_gpu_blocks, kv_cache_tensors=[], kv_cache_groups=groups,
                              hash_block_size=block_size)
    config.cache_config.num_gpu_blocks = num_gpu_blocks
    return cls(vllm_config=config, kv_cache_config=kv_config, structured_output_manager=StructuredOutputManager(config),
               block_size=block_size, log_stats=False)


@dataclass
class Run:
    steps: int = 0
    finished: int = 0
    rejected: int = 0
    preemptions: int = 0
    waits: list = field(default_factory=list)
    makespan_s: float = 0.0
    schedule_s: list = field(default_factory=list)  # wall seconds of each schedule() call
    errors: dict = field(default_factory=dict)  # request id -> the error the API client gets

    def figures(self) -> dict:
        from kvbudget.traces.results import percentile

        return dict(finished=self.finished, rejected=self.rejected, preemptions=self.preemptions,
                    wait_p50_s=round(percentile(self.waits, 50), 3), wait_p99_s=round(percentile(self.waits, 99), 3),
                    makespan_s=round(self.makespan_s, 3))


def make_request(row, request_id: str, max_tokens: int, hasher=None):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=max_tokens, stop_token_ids=[STOP])
    prompt = [(hash((request_id, i)) % 50000) + 10 for i in range(row.prompt_tokens)]
    return Request(request_id=request_id, prompt_token_ids=prompt, sampling_params=params, pooling_params=None,
                   arrival_time=row.arrival_s, block_hasher=hasher)


def drive(scheduler, rows, max_tokens: int, *, step_base_s: float = 0.020, per_prefill_token_s: float = 50e-6,
          on_step=None, max_steps: int = 1_000_000) -> Run:
    """Plays `rows` (TraceRequest) through `scheduler`; `on_step(run)` after each step."""
    from vllm.v1.outputs import ModelRunnerOutput

    run, t, i, idle = Run(), 0.0, 0, 0
    arrival, want, first = {}, {}, {}
    while (i < len(rows) or scheduler.has_unfinished_requests()) and run.steps < max_steps:
        while i < len(rows) and rows[i].arrival_s <= t + 1e-12:
            rid = f"r{i}"
            arrival[rid], want[rid] = rows[i].arrival_s, rows[i].output_tokens
            scheduler.add_request(make_request(rows[i], rid, max_tokens))
            i += 1
        if not scheduler.has_unfinished_requests():
            t = rows[i].arrival_s
            continue
        started = time.perf_counter()
        out = scheduler.schedule()
        run.schedule_s.append(time.perf_counter() - started)
        run.steps += 1
        run.preemptions += len(out.preempted_req_ids or ())
        ids = list(out.num_scheduled_tokens)
        sampled, prefill = [], 0
        for rid in ids:
            request = scheduler.requests[rid]
            first.setdefault(rid, t)
            if request.is_prefill_chunk:
                sampled.append([])
                prefill += out.num_scheduled_tokens[rid]
                continue
            # The chunk that ends a prompt, or a recompute after a preemption, is prefill too
            # (as the replay's engine models count it); a decode's one token is not.
            if request.num_output_tokens == 0 or out.num_scheduled_tokens[rid] > 1:
                prefill += out.num_scheduled_tokens[rid]
            sampled.append([STOP if request.num_output_tokens + 1 >= want[rid] else SAMPLED])
        result = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
                                   sampled_token_ids=sampled)
        outputs = scheduler.update_from_output(out, result)
        dt = step_base_s + prefill * per_prefill_token_s if ids else step_base_s
        t += dt
        for eco in outputs.values():
            for o in eco.outputs:
                if o.finish_reason is None:
                    continue
                if o.error is not None:
                    run.rejected += 1
                    run.errors[o.request_id] = o.error.message
                else:
                    run.finished += 1
                run.makespan_s = t
        idle = 0 if ids or i < len(rows) else idle + 1
        if idle > 1000:
            raise RuntimeError(f"stuck: nothing scheduled for {idle} steps; waiting "
                               f"{[r.request_id for r in scheduler.waiting]}, running {[r.request_id for r in scheduler.running]}")
        if on_step is not None:
            on_step(run)
    run.waits = [first[rid] - arrival[rid] for rid in first]
    return run
