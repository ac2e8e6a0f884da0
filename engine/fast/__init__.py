"""Python-level fast variants of the schedulers: same decisions, fewer Python operations per step.

Lazy decoders (``decode``, ``lazy_v1``, ``fast_v1``) and blocked-head skipping (``blocked_head``).
Cost mode uses them where the compiled core (``engine.compiled``) does not yet cover a case;
they go away once it does (issue 26).
"""
