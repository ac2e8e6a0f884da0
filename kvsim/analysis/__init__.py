"""Analysis of the event stream: every metric and every picture's data comes from here.

``metrics`` builds the requests / steps / summary tables; ``kv_breakdown`` accounts where the
KV slots go (token states, reservation, fragmentation); ``occupancy`` reconstructs who held
which block when, and request states; ``events_io`` reads and writes events.parquet
(``exploded_rows``: its rows, one per event and block);
``prefix_blocks`` and ``cache_curve`` compute offline prefix-cache curves of a trace with
hash_ids (no simulation).
"""
