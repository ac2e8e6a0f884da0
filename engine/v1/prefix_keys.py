"""Block hash keys for prefix caching: what makes two sequences' full KV blocks the same.

vLLM hashes each full block as (parent block's hash, the block's token ids), a chain, so a
block is shared exactly when every token up to its end is the same. kvsim keys blocks the
same way, with Python's 64-bit ``hash`` of int tuples (deterministic across runs: ints and
tuples of ints are not salted). A sequence gets its keys from one of three sources:

- its token ids (the default, engine mode): key of block i = hash((key of block i-1,
  the block's token ids));
- ``HashIdPrefix``, from a trace's ``hash_ids`` (cost mode, placeholder tokens): the
  tokens are never materialised. A trace hash id stands for ``hash_block_size`` tokens;
  kvsim block i lies inside the prompt's hashed part and is keyed by (the chain of hash
  ids up to the last one it overlaps, i), which is equal exactly when the token prefix
  up to its end is (any ``block_size``, any ``hash_block_size``);
- ``UNIQUE_PREFIX``: a prompt shared with no other request (cost-mode requests without
  hash ids). Its blocks still get keys, so a preempted sequence re-hits its own blocks.

With a prefix source, every generated token is taken to be the same placeholder: the block
the prompt ends in and every later block are keyed by (parent, GEN), so identical prompts
decoding in lockstep share their generated blocks, as vLLM's do under a fixed sampled token.
Keys are computed lazily, block by block, when a lookup or a cache insertion needs them.
"""

from __future__ import annotations

from collections.abc import Sequence as Ints

import numpy as np

# Tags that keep the key families apart (any constant works: they only enter tuple hashes).
TOKEN_ROOT = -0x6B76_7369_6D00  # parent "hash" of a token-keyed sequence's first block
_HASH_ID_ROOT = -0x6B76_7369_6D01  # start of a hash-id chain
_UNIQUE = -0x6B76_7369_6D02  # prompt blocks shared with nobody (salted by seq_id)
GEN_TAG = -0x6B76_7369_6D03  # a block holding placeholder (generated) tokens
_PROMPT_END = -0x6B76_7369_6D04  # the identity of a whole prompt


_M1, _M2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), 0x9E3779B97F4A7C15
# numpy scalars made once, and the shifts written into one scratch array: the same values
# at 2.3x the speed on a 32-block range (17 -> 7.4 us per call on this machine).
_GOLDEN_U64, _S27, _S30, _S31 = np.uint64(_GOLDEN), np.uint64(27), np.uint64(30), np.uint64(31)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 (wrapping): a cheap, well-spread 64-bit hash that
    keys a whole range of blocks in a few numpy operations. ``x`` is not changed."""
    x = x + _GOLDEN_U64
    shifted = x >> _S30
    x ^= shifted
    x *= _M1
    np.right_shift(x, _S27, out=shifted)
    x ^= shifted
    x *= _M2
    np.right_shift(x, _S31, out=shifted)
    x ^= shifted
    return x


_MASK = (1 << 64) - 1
_UNIQUE_STRIDE = np.uint64(_GOLDEN)  # odd: i -> i * stride is a bijection mod 2^64


def _mix_int(x: int) -> int:
    """``_mix`` of one uint64 held in a Python int (a few keys: cheaper than numpy)."""
    x = (x + _GOLDEN) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


# mix(i) of block indexes 0 .. 2^14 - 1 (256 k tokens at block size 16), made once: one of
# _block_keys' two _mix calls (with the _mix above, 66 -> 45 us per 32-block call; on the
# whole Mooncake run within noise: 54.0 vs 53.9 s CPU, bench_mooncake.py's command).
with np.errstate(over="ignore"):
    _MIXED_INDEX = _mix(np.arange(1 << 14, dtype=np.uint64))
_MIXED_INDEX.flags.writeable = False
with np.errstate(over="ignore"):
    _UNIQUE_STEPS = np.arange(1 << 14, dtype=np.uint64) * _UNIQUE_STRIDE  # i * stride
_UNIQUE_STEPS.flags.writeable = False


def _block_keys(parents: np.ndarray, start: int, end: int) -> list[int]:
    """Keys of blocks start..end-1 from each block's identifying value ``parents`` (int64):
    mix(parent xor mix(block index)), as signed 64-bit ints."""
    if end - start <= 4:
        keys: list[int] = []
        for parent, i in zip(parents.tolist(), range(start, end)):
            key = _mix_int((parent & _MASK) ^ _mix_int(i))
            keys.append(key - (1 << 64) if key >> 63 else key)
        return keys
    with np.errstate(over="ignore"):
        if end <= len(_MIXED_INDEX):
            mixed_index = _MIXED_INDEX[start:end]
        else:
            mixed_index = _mix(np.arange(start, end, dtype=np.uint64))
        mixed = _mix(parents.view(np.uint64) ^ mixed_index)
    return mixed.view(np.int64).tolist()  # type: ignore[no-any-return]


class PrefixSource:
    """Keys of a prompt's full blocks without its token ids (see the module docstring)."""

    __slots__ = ()
    # False when no other request can share the prompt's blocks: a sequence's first lookup
    # then cannot hit and is skipped.
    shared = True

    def prompt_block_keys(self, salt: int, start: int, end: int, block_size: int) -> list[int]:
        """Keys of full prompt blocks ``start .. end - 1``; ``salt`` is the seq_id."""
        raise NotImplementedError

    def prompt_key(self, salt: int, num_prompt_tokens: int) -> int:
        """A key equal for two sequences exactly when their whole prompts are equal."""
        raise NotImplementedError

    def prompt_block_key_array(self, salt: int, start: int, end: int) -> np.ndarray:
        """``prompt_block_keys`` as an int64 array (for sources whose keys need no block
        size: those that are not ``shared``)."""
        raise NotImplementedError


class UniquePrefix(PrefixSource):
    """A prompt no other request shares (its keys are salted with the seq_id, which must
    then be unique among the BlockManager's sequences)."""

    __slots__ = ()
    shared = False

    def prompt_block_keys(self, salt: int, start: int, end: int, block_size: int) -> list[int]:
        # Nobody else's block can carry these keys (they never enter the cache's map: only a
        # preempted sequence's own resume looks for them), so they need to be distinct, not
        # mixed: base + i * odd constant (mod 2^64) is. Three numpy operations instead of
        # _block_keys' two splitmix rounds: 24 -> 12 us for a 64-block prompt.
        return self.prompt_block_key_array(salt, start, end).tolist()  # type: ignore[no-any-return]

    def prompt_block_key_array(self, salt: int, start: int, end: int) -> np.ndarray:
        base = np.uint64(hash((_UNIQUE, salt)) & _MASK)
        if end <= len(_UNIQUE_STEPS):
            # one addition to a table made once, no errstate (array arithmetic wraps without
            # a warning): 7.7 -> 2.4 us for 80 blocks (timeit)
            return (_UNIQUE_STEPS[start:end] + base).view(np.int64)  # type: ignore[no-any-return]
        with np.errstate(over="ignore"):
            keys = np.arange(start, end, dtype=np.uint64) * _UNIQUE_STRIDE + base
        return keys.view(np.int64)  # type: ignore[no-any-return]

    def prompt_key(self, salt: int, num_prompt_tokens: int) -> int:
        return hash((_UNIQUE, salt, _PROMPT_END))

    def __repr__(self) -> str:
        return "UNIQUE_PREFIX"


UNIQUE_PREFIX = UniquePrefix()


class HashIdPrefix(PrefixSource):
    """A prompt described by a trace's ``hash_ids``: one id per ``hash_block_size`` tokens;
    equal ids stand for equal tokens (as the reference driver derives them). Tokens past the
    last hash id (a trace that covers fewer tokens than the prompt) are unique to the
    request. Build it with ``prefix_from_hash_ids``."""

    __slots__ = ("_chain", "hash_block_size", "num_hashed_tokens", "num_prompt_tokens")

    def __init__(self, hash_ids: Ints[int], hash_block_size: int, num_prompt_tokens: int) -> None:
        if not isinstance(hash_block_size, int) or hash_block_size < 1:
            raise ValueError(f"hash_block_size must be a positive integer, got {hash_block_size!r}")
        if not isinstance(num_prompt_tokens, int) or num_prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be a positive integer, got {num_prompt_tokens!r}")
        self.hash_block_size = hash_block_size
        self.num_prompt_tokens = num_prompt_tokens
        # Only the hash blocks that hold prompt tokens matter.
        used = min(len(hash_ids), -(-num_prompt_tokens // hash_block_size))
        chain: list[int] = []
        parent = _HASH_ID_ROOT
        for h in hash_ids[:used]:
            parent = hash((parent, int(h)))
            chain.append(parent)
        self._chain = np.array(chain, dtype=np.int64)
        self.num_hashed_tokens = min(used * hash_block_size, num_prompt_tokens)

    def prompt_block_keys(self, salt: int, start: int, end: int, block_size: int) -> list[int]:
        hbs, chain = self.hash_block_size, self._chain
        # blocks ending inside the hashed part are keyed by the chain; later ones are unique
        hashed_end = min(end, self.num_hashed_tokens // block_size)
        keys: list[int] = []
        if start < hashed_end:
            last_id = (np.arange(start + 1, hashed_end + 1) * block_size - 1) // hbs
            keys = _block_keys(chain[last_id], start, hashed_end)
        if hashed_end < end:
            keys += UNIQUE_PREFIX.prompt_block_keys(salt, max(start, hashed_end), end, block_size)
        return keys

    def prompt_key(self, salt: int, num_prompt_tokens: int) -> int:
        if num_prompt_tokens <= self.num_hashed_tokens:
            last = int(self._chain[(num_prompt_tokens - 1) // self.hash_block_size])
            return hash((last, _PROMPT_END, num_prompt_tokens))
        return hash((_UNIQUE, salt, _PROMPT_END))

    def __repr__(self) -> str:
        return (
            f"HashIdPrefix({len(self._chain)} hash ids of {self.hash_block_size} tokens, "
            f"prompt {self.num_prompt_tokens})"
        )


def prefix_from_hash_ids(
    hash_ids: Ints[int] | None, hash_block_size: int | None, prompt_tokens: int, block_size: int
) -> PrefixSource:
    """What a Sequence needs (``Sequence(..., prefix=...)``) to take part in prefix caching
    from a trace's ``hash_ids`` without any token ids: a ``HashIdPrefix``, or
    ``UNIQUE_PREFIX`` when the request has no hash ids. ``block_size`` (tokens per KV
    block) is checked only: keys are made at any block size. O(hash ids) work; block keys
    are computed later, when needed."""
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    if not hash_ids:
        return UNIQUE_PREFIX
    if hash_block_size is None:
        raise ValueError("hash_ids need a hash_block_size (tokens per hash id)")
    return HashIdPrefix(hash_ids, hash_block_size, prompt_tokens)
