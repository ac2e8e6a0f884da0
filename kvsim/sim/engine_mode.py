"""Engine mode: the real torch engine runs every step; simulated time advances by the measured
wall time of each step (synchronised on CUDA).

The simulation drives the LLMEngine's own Scheduler and BlockManager, so cost mode and engine
mode differ only in the executor. Requests get deterministic prompt token ids: the same seed,
request id and hash_ids always give the same tokens, and requests that share a prefix of
hash_ids share those tokens (so a prefix cache would see real prefix hits).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence as TokenIds
from typing import TYPE_CHECKING

import numpy as np

from engine import Scheduler, SchedulerOutput
from kvsim.config import RunConfig, SchedulingLimits
from kvsim.option_spec import ConfigError
from workloads import Request

if TYPE_CHECKING:
    from engine import LLMEngine

# Token ids stay clear of the few lowest ids (often BOS/EOS/PAD in real vocabularies).
FIRST_TOKEN_ID = 3


# A request with a session_id and no hash_ids reads its prompt off its session's one token
# stream: the requests of a conversation share their prompts up to the shorter one (each turn
# resends the conversation so far). As hash ids: one id spanning any prompt.
SESSION_STREAM_TOKENS = 1 << 40


def session_stream_key(session_id: str) -> int:
    """The session's stream as a hash id (crc32, not hash(): stable across processes)."""
    return 2 << 40 | zlib.crc32(session_id.encode("utf-8", "surrogatepass"))


class PromptTokens:
    """Deterministic prompt token ids for trace requests on a ``vocab_size`` vocabulary:
    equal ``hash_ids`` give equal tokens; without them, a request with a ``session_id`` takes
    the first tokens of its session's stream; otherwise the tokens are the request's own."""

    def __init__(self, vocab_size: int, seed: int, hash_block_size: int | None) -> None:
        if vocab_size <= FIRST_TOKEN_ID:
            raise ConfigError(f"vocabulary of {vocab_size} tokens is too small for engine mode")
        self.vocab_size = vocab_size
        self.seed = seed
        self.hash_block_size = hash_block_size
        self._blocks: dict[int, np.ndarray] = {}

    def _draw(self, key: int, n: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, key])
        return rng.integers(FIRST_TOKEN_ID, self.vocab_size, size=n, dtype=np.int64)

    def __call__(self, request: Request) -> list[int]:
        n = request.prompt_tokens
        if request.hash_ids and self.hash_block_size:
            size = self.hash_block_size
            parts = []
            for h in request.hash_ids:
                block = self._blocks.get(h)
                if block is None:
                    block = self._blocks[h] = self._draw(h & 0x7FFFFFFFFFFFFFFF, size)
                parts.append(block)
            tokens = np.concatenate(parts)[:n]
            if len(tokens) < n:  # hash_ids cover fewer tokens than the prompt: pad per request
                tokens = np.concatenate([tokens, self._request_tokens(request, n - len(tokens))])
        elif request.session_id is not None:
            # numpy draws element by element: a longer draw extends a shorter one
            tokens = self._draw(session_stream_key(request.session_id), n)
        else:
            tokens = self._request_tokens(request, n)
        ids: list[int] = tokens.tolist()
        return ids

    def _request_tokens(self, request: Request, n: int) -> np.ndarray:
        # crc32 of the id (not hash()) so the tokens do not change between Python processes.
        return self._draw(1 << 40 | zlib.crc32(request.request_id.encode()), n)


class EngineExecutor:
    """Runs each scheduled step on the LLMEngine's model and measures it (seconds)."""

    placeholder_tokens = False

    def __init__(self, llm: LLMEngine) -> None:
        self.llm = llm
        self._cuda = llm.kv_cache.key_cache[0].device.type == "cuda"

    def execute(self, out: SchedulerOutput, scheduler: Scheduler) -> tuple[float, list[int]]:
        import torch

        start = time.perf_counter()
        tokens = self.llm.execute_model(out)
        if self._cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start, tokens


def check_device(device: str) -> None:
    """Raise ``ConfigError`` unless torch can use ``device`` (cpu, cuda, cuda:N)."""
    if not device.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU build"
        raise ConfigError(
            f"--device {device}: no CUDA device is available (torch {torch.__version__} is "
            f"{built}); use --device cpu"
        )
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise ConfigError(
            f"--device {device}: there are {torch.cuda.device_count()} CUDA devices (0 to "
            f"{torch.cuda.device_count() - 1})"
        )


def build_llm(config: RunConfig, limits: SchedulingLimits) -> LLMEngine:
    """The LLMEngine for ``config`` (model preset or checkpoint folder, device, dtype) with
    ``limits`` (config's batch limits, defaults resolved)."""
    from engine import LLMEngine

    check_device(config.device)
    if config.threads is not None:
        from kvsim.sim.engine_timing import pin_threads

        # Measured step times are only meaningful without oversubscribed cores.
        pin_threads(config.threads)
    try:
        return LLMEngine(
            config.model,
            block_size=config.block_size,
            num_blocks=config.num_blocks,
            device=config.device,
            dtype=config.dtype,
            max_num_seqs=limits.max_num_seqs,
            max_num_batched_tokens=limits.max_num_batched_tokens,
            max_model_len=config.max_model_len,
            watermark=limits.watermark,
            seed=config.seed,
            scheduler=config.resolved_scheduler(),
            enable_prefix_caching=config.caches_prefixes(),
            enable_chunked_prefill=config.enable_chunked_prefill,
            long_prefill_token_threshold=config.long_prefill_token_threshold,
            policy=config.scheduling_policy,
        )
    except (ValueError, OSError, RuntimeError) as exc:
        raise ConfigError(f"engine mode: cannot build model {config.model!r}: {exc}") from None


def prompt_token_ids(
    requests: list[Request], vocab_size: int, seed: int = 0, hash_block_size: int | None = None
) -> list[TokenIds[int]]:
    """The prompt token ids engine mode gives ``requests`` (for notebooks and tests)."""
    tokens_of = PromptTokens(vocab_size, seed, hash_block_size)
    return [tokens_of(r) for r in requests]
