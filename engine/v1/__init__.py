"""vLLM 0.33's v1 scheduling, the readable specification kvsim's decisions are checked against.

The block pool halves the BlockManager mixes in (``kv_cache_manager``, ``prefix_cache``,
``decode_blocks``), the prefix-cache keys (``prefix_keys``), the waiting queue (``request_queue``)
and ``scheduler`` (V1Scheduler). docs/engine.md lists every rule with its vLLM source.
"""
