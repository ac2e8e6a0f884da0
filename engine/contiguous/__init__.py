"""Contiguous KV allocators, the pre-paging baselines kvsim compares paging against.

``allocator`` reserves each request's maximum length up front (first-fit) and ``buddy``
rounds reservations up to powers of two.
"""
