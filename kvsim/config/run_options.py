"""RunOptions: every option of one simulation, unchecked: the groups' fields (serving.py,
workload.py, fleet.py, offload.py) and RunConfig's own (the allocator, the engine-mode
options), with what they imply (the scheduler a run resolves to, whether it caches prefixes,
offloads, sets a P/D fleet's pools).

RunConfig (kvsim/config/run_config.py) is RunOptions checked on construction (its fields'
types and bounds, then the rules of kvsim/config/rules.py, which read RunOptions); nothing
else builds a RunOptions.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.config.fleet import FleetOptions
from kvsim.config.offload import OffloadOptions
from kvsim.config.serving import ServingOptions
from kvsim.config.types import DEFAULT_THREADS, Allocator
from kvsim.config.workload import WorkloadOptions
from kvsim.option_spec import at_least, one_of, option


# The groups' fields come first, in this order (dataclasses collect base fields from the last
# base to the first): serving, workload, fleet, offload, then RunOptions' own. The order is
# config.json's, --help's and docs/options.md's.
@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions(OffloadOptions, FleetOptions, WorkloadOptions, ServingOptions):
    """One simulation's options, before RunConfig checks them. Units: tokens, blocks,
    seconds, requests per second."""

    allocator: Allocator = option(
        "paged",
        help="KV allocator: paged (vLLM), or a contiguous baseline reserving max_model_len "
        "(max), prompt + next power of two of the output (pow2), or prompt + the exact "
        "output (oracle)",
        unit="NAME",
        sweep="axis",
        sweep_help="Allocators to sweep: paged, max, pow2, oracle (comma-separated)",
    )
    fast_decode: bool = option(
        True,
        help="FastDecodeScheduler in cost mode (results identical either way; False runs the "
        "plain Scheduler, for comparisons)",
        run=False,
        sweep="param",
    )
    # engine mode only
    device: str = option(
        "cpu",
        help="Engine mode: cpu or cuda (cuda:N for one of several GPUs)",
        unit="DEVICE",
        sweep="no",
        check=one_of("cpu", "cuda", pattern=r"cuda:\d{1,3}"),
    )
    dtype: str = option(
        "float32",
        help="Engine mode: float32, bfloat16 or float16",
        unit="DTYPE",
        sweep="no",
        check=one_of("float32", "bfloat16", "float16"),
    )
    threads: int | None = option(
        DEFAULT_THREADS,
        help="Engine mode: torch CPU threads, pinned (one inter-op thread); 1 keeps measured step "
        "times stable on a shared machine, raise it on a dedicated one; null in config.json: "
        "torch's choice (one per core: runs can differ 300x under contention)",
        unit="THREADS",
        sweep="no",
        check=at_least(1, maximum=4096),
    )

    def sets_pd_pools(self) -> bool:
        """Whether a P/D pool's own GPU or TP is given (--pd-prefill-gpu, ...)."""
        pools = (self.pd_prefill_gpu, self.pd_prefill_tp, self.pd_decode_gpu, self.pd_decode_tp)
        return any(v is not None for v in pools)

    def caches_prefixes(self) -> bool:
        """Whether the run caches prefixes (v1 only: classic never reuses a block)."""
        return self.resolved_scheduler() == "v1" and self.enable_prefix_caching

    def resolved_scheduler(self) -> str:
        """``scheduler``, or its default: v1, classic for a contiguous allocator."""
        if self.scheduler is not None:
            return self.scheduler
        return "v1" if self.allocator == "paged" else "classic"

    def offloads(self) -> bool:
        """Whether the run has a KV offload tier (--kv-offloading-size above 0)."""
        return self.kv_offloading_size > 0
