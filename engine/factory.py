"""Choosing a scheduler: the one table of which class runs which policy.

=============  ==================================  ===============================================
policy         readable (engine mode, tests)        fast (cost mode: placeholder tokens only)
=============  ==================================  ===============================================
``classic``    ``Scheduler`` (engine.core)          ``FastDecodeScheduler`` (engine.fast.decode)
``v1``         ``V1Scheduler`` (engine.v1)          ``FastV1Scheduler`` (engine.fast.fast_v1)
=============  ==================================  ===============================================

The fast classes make the same decisions, block ids and events as the readable ones (their
differential and golden tests hold them equal) but need every sampled token to be a placeholder,
so only the simulator's cost mode uses them. ``make_scheduler`` is the way in;
``Scheduler(config, bm)`` and ``FastDecodeScheduler(config, bm)`` still honour
``config.scheduler`` for callers written before this module (they ask ``scheduler_class``).
"""

from __future__ import annotations

from typing import Any

from engine.core.block_manager import BlockManager
from engine.core.errors import SchedulerError
from engine.core.events import EventSink
from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import SchedulerConfig
from engine.fast.decode import FastDecodeScheduler
from engine.fast.fast_v1 import FastV1Scheduler
from engine.v1.scheduler import V1Scheduler

_CLASSES: dict[tuple[str, bool], type[Scheduler]] = {
    ("classic", False): Scheduler,
    ("classic", True): FastDecodeScheduler,
    ("v1", False): V1Scheduler,
    ("v1", True): FastV1Scheduler,
}


def scheduler_class(config: SchedulerConfig, *, fast: bool = False) -> type[Scheduler]:
    """The class that runs ``config.scheduler`` (``"classic"`` or ``"v1"``); ``fast`` picks the
    placeholder-token variant (see the module docstring)."""
    return _CLASSES[(config.scheduler, fast)]


def make_scheduler(
    config: SchedulerConfig,
    block_manager: BlockManager,
    event_sink: EventSink | None = None,
    *,
    fast: bool = False,
    **kwargs: Any,
) -> Scheduler:
    """A scheduler for ``config`` driving ``block_manager``. ``fast=True`` gives the
    placeholder-token variant (keyword ``token``: the token every decode samples, default 0);
    ``offload`` (an engine.offload.OffloadConfig) the v1 scheduler with a CPU tier
    (engine/v1/offloading_scheduler.py).
    Events go to ``event_sink``, else to the block manager's sink."""
    if kwargs.get("offload") is not None:
        if config.scheduler != "v1" or fast:
            raise SchedulerError("KV offloading runs on the readable v1 scheduler only")
        # imported here: a run without a CPU tier never loads the offload tier's modules
        # (engine.offload's manager, policies, connector and secondary tiers: ~15 ms of
        # every `kvsim run`'s start)
        from engine.v1.offloading_scheduler import OffloadingV1Scheduler

        return OffloadingV1Scheduler(config, block_manager, event_sink, **kwargs)
    kwargs.pop("offload", None)
    return scheduler_class(config, fast=fast)(config, block_manager, event_sink, **kwargs)


def v1_counterpart(classic: type[Scheduler]) -> type[Scheduler]:
    """The v1 class standing where ``classic`` stands in the table: what ``Scheduler(config)``
    and ``FastDecodeScheduler(config)`` build when ``config.scheduler == "v1"``."""
    for (policy, fast), cls in _CLASSES.items():
        if cls is classic and policy == "classic":
            return _CLASSES[("v1", fast)]
    raise SchedulerError(
        f"{classic.__name__} has no v1 scheduler; build one with engine.factory.make_scheduler"
    )
