"""LLMEngine: the schedule -> run -> update loop over one model, one KV pool and one Scheduler.

The Scheduler and BlockManager are the very objects the simulator drives; an executor that keeps
its own clock calls `scheduler.schedule()`, `execute_model(output)` and `scheduler.update()`
itself instead of `step()`.
"""

from __future__ import annotations

from collections.abc import Sequence as TokenIds
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from engine.core.block_manager import BlockManager
from engine.core.events import EventSink
from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import SchedulerConfig, SchedulerOutput
from engine.core.sequence import SamplingParams, Sequence
from engine.factory import make_scheduler
from engine.torch_engine.kv_cache import KVCache, bytes_per_block
from engine.torch_engine.loader import load_model, resolve_dtype
from engine.torch_engine.model_runner import ModelRunner
from engine.torch_engine.models.config import ModelConfig

DEFAULT_CPU_KV_CACHE_BYTES = 256 * 2**20  # pool size on CPU when neither size is given
DEFAULT_CUDA_KV_CACHE_FRACTION = 0.8  # share of free device memory (after weights) on CUDA


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """A request's state after a step: `token_ids` are the generated ids so far."""

    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    finished: bool
    finish_reason: str | None  # "stop", "length", "aborted" or a rejection reason
    num_preemptions: int = 0
    prefix_hit_tokens: int = 0  # prompt tokens served from the prefix cache, latest admission

    @classmethod
    def from_sequence(cls, seq: Sequence) -> RequestOutput:
        return cls(
            request_id=seq.seq_id,
            prompt_token_ids=list(seq.prompt_token_ids),
            token_ids=list(seq.generated_token_ids),
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            num_preemptions=seq.num_preemptions,
            prefix_hit_tokens=seq.prefix_hit_tokens,
        )


class LLMEngine:
    """A paged-attention engine on `device`.

    `model` is a preset name ("tiny-llama", "llama-1b": seeded random weights) or a local Hugging
    Face checkpoint folder. The pool holds `num_blocks` blocks of `block_size` tokens, or as many
    as fit in `kv_cache_bytes`; with neither, 256 MiB on CPU, or 80% of the device memory left
    free after loading the weights on CUDA. `watermark` (a fraction of the pool) is kept free
    when admitting prefills, as in BlockManager.

    `scheduler="v1"` (the default) schedules as vLLM 0.33's v1 scheduler: one budget of
    `max_num_batched_tokens` per step shared by decodes and prefill chunks
    (`enable_chunked_prefill`, `long_prefill_token_threshold`), `policy` "fcfs" or "priority",
    and, with `enable_prefix_caching`, full blocks reused across requests by content.
    `scheduler="classic"` is vLLM's 2023 scheduler (prefill or decode steps; those options are
    ignored). Every step runs for real: prefill chunks attend to the K/V already in the pool.
    """

    def __init__(
        self,
        model: str | Path = "tiny-llama",
        *,
        block_size: int = 16,
        num_blocks: int | None = None,
        kv_cache_bytes: int | None = None,
        device: str | torch.device = "cpu",
        dtype: str = "float32",
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        max_model_len: int | None = None,
        watermark: float = 0.0,
        seed: int = 0,
        event_sink: EventSink | None = None,
        enable_prefix_caching: bool = False,
        scheduler: str = "v1",
        enable_chunked_prefill: bool = True,
        long_prefill_token_threshold: int = 0,
        policy: str = "fcfs",
    ) -> None:
        if num_blocks is not None and kv_cache_bytes is not None:
            raise ValueError("give num_blocks or kv_cache_bytes, not both")
        torch_dtype = resolve_dtype(dtype)
        self._model = load_model(model, device=device, dtype=torch_dtype, seed=seed)
        config = self._model.config
        if num_blocks is None:
            budget = kv_cache_bytes if kv_cache_bytes is not None else _default_budget(device)
            per_block = bytes_per_block(
                num_layers=config.num_hidden_layers,
                block_size=block_size,
                num_kv_heads=config.num_key_value_heads,
                head_dim=config.head_dim,
                dtype=torch_dtype,
            )
            num_blocks = max(1, budget // per_block)
        self._kv_cache = KVCache(
            num_layers=config.num_hidden_layers,
            num_blocks=num_blocks,
            block_size=block_size,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            dtype=torch_dtype,
            device=device,
        )
        self._block_manager = BlockManager(
            num_blocks,
            block_size,
            watermark=watermark,
            event_sink=event_sink,
            enable_prefix_caching=enable_prefix_caching,
        )
        self._scheduler = make_scheduler(
            SchedulerConfig(
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                max_model_len=max_model_len or config.max_position_embeddings,
                scheduler=scheduler,
                enable_chunked_prefill=enable_chunked_prefill,
                long_prefill_token_threshold=long_prefill_token_threshold,
                policy=policy,
            ),
            self._block_manager,
        )
        self._runner = ModelRunner(self._model, self._kv_cache, seed=seed)
        self._next_request_id = 0

    # --- read-only parts, for the simulator's engine-mode executor ---------------------------

    @property
    def scheduler(self) -> Scheduler:
        return self._scheduler

    @property
    def block_manager(self) -> BlockManager:
        return self._block_manager

    @property
    def model_runner(self) -> ModelRunner:
        return self._runner

    @property
    def kv_cache(self) -> KVCache:
        return self._kv_cache

    @property
    def model_config(self) -> ModelConfig:
        return self._model.config

    # --- requests ------------------------------------------------------------------------------

    def add_request(
        self,
        prompt_token_ids: TokenIds[int],
        sampling_params: SamplingParams | None = None,
        arrival_time: float = 0.0,
        priority: int = 0,
    ) -> int:
        """Queue a prompt; returns its request id (0, 1, 2, ... per engine). `priority` orders
        requests under policy="priority" (lower first).

        Unless the request sets `eos_token_id` or `ignore_eos`, it stops at the checkpoint's
        EOS ids (config.json `eos_token_id`; presets have none).
        """
        vocab = self._model.config.vocab_size
        bad = [t for t in prompt_token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        request_id = self._next_request_id
        self._next_request_id += 1
        params = self._with_model_eos(sampling_params or SamplingParams())
        seq = Sequence(request_id, list(prompt_token_ids), params, arrival_time, priority)
        self._scheduler.add_request(seq)
        return request_id

    def _with_model_eos(self, params: SamplingParams) -> SamplingParams:
        """Fill in the checkpoint's EOS ids (config.json) when the request names none."""
        eos = self._model.config.eos_token_ids
        if params.eos_token_id is not None or params.ignore_eos or not eos:
            return params
        extra = tuple(t for t in eos[1:] if t not in params.stop_token_ids)
        return replace(params, eos_token_id=eos[0], stop_token_ids=params.stop_token_ids + extra)

    def abort(self, request_id: int) -> bool:
        """Cancel a waiting or running request and free its blocks; False if unknown/finished."""
        return self._scheduler.abort(request_id)

    def has_unfinished(self) -> bool:
        return self._scheduler.has_unfinished()

    # --- the loop ------------------------------------------------------------------------------

    def execute_model(self, output: SchedulerOutput) -> list[int]:
        """Run one scheduled step on the model; one sampled token per `output.seqs` entry."""
        return self._runner.run(output)

    def step(self) -> list[RequestOutput]:
        """Schedule, run, update once. Outputs of every request scheduled, rejected or
        finished this step."""
        output = self._scheduler.schedule()
        sampled = self.execute_model(output)
        finished = self._scheduler.update(output, sampled)
        seen = {s.seq_id for s in output.seqs}
        seqs = [*output.seqs, *(s for s in finished if s.seq_id not in seen)]
        return [RequestOutput.from_sequence(s) for s in seqs]

    def generate(
        self,
        prompts: list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run `prompts` (and anything already queued) to completion; outputs in prompt order."""
        if isinstance(sampling_params, list):
            if len(sampling_params) != len(prompts):
                raise ValueError(
                    f"{len(sampling_params)} sampling params for {len(prompts)} prompts"
                )
            params = sampling_params
        else:
            params = [sampling_params or SamplingParams()] * len(prompts)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params)]
        done: dict[int, RequestOutput] = {}
        while self.has_unfinished():
            for out in self.step():
                if out.finished:
                    done[out.request_id] = out
        return [done[i] for i in ids]


def _default_budget(device: str | torch.device) -> int:
    """Default pool bytes: fixed on CPU, a share of free memory on CUDA."""
    if torch.device(device).type == "cuda":
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(DEFAULT_CUDA_KV_CACHE_FRACTION * free)
    return DEFAULT_CPU_KV_CACHE_BYTES
