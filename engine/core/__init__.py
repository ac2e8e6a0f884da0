"""The engine core a reader meets first: sequences, the BlockManager, the classic scheduler, events.

Nothing here imports torch. ``engine.core.block_manager`` owns the pool of fixed-size KV blocks
(free list, block tables, slot mappings, ref counts); ``engine.core.scheduler`` is the 2023
(vLLM v0) scheduler and the base class of the v1 one; ``engine.core.events`` records every block
operation and step.
"""
