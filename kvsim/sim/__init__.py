"""The simulation: a simpy clock that replays a trace through the engine's Scheduler.

``simulation`` is the clock (workload processes and one engine-loop process, multi-step
decoding); ``executor`` prices a step with the cost model (cost mode); ``engine_mode`` runs it
on the real torch engine and measures it; ``allocators`` builds the KV allocator of a run (the
paged BlockManager or a contiguous baseline); ``gc_passes`` runs a block with fewer passes of
the cyclic garbage collector (the engine loop, and each CLI command). ``kvsim.runner`` puts
them together.
"""
