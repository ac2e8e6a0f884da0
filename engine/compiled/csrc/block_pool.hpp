// vLLM v1's block pool: the free queue, the prefix cache and per-request block allocation.
//
// The compiled counterpart of the Python BlockManager in v1 mode (engine/v1/
// kv_cache_manager.py, prefix_cache.py, decode_blocks.py). Its contract is exactness: the
// same operations give the same block ids, free-queue order, evictions, counters and event
// rows as the Python path, which tests/engine/test_compiled_pool.py checks step by step.
// The Python path's speed tricks (stale queue entries, lazy or deferred keying, numpy
// batches) are not reproduced, only what they are observably equal to: eager caching into a
// linked free queue and a hash map.
//
// Requests are addressed by a handle from add_request (a dense index, reused after
// remove_request), so a compiled scheduler can keep its own request state beside it. The
// pool keeps only what it needs: the key source, the keys made so far, the block table, how
// many leading blocks are cached, and (for a unique prompt) the cached part of each table it
// was preempted with. Computed tokens belong to the scheduler and are passed in.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "event_buffer.hpp"
#include "free_queue.hpp"
#include "prefix_index.hpp"
#include "prefix_keys.hpp"

namespace kvsim {

constexpr int64_t kFreeOwner = -1;  // owner of a block nobody holds (invariants.py)

struct RequestBlocks {
  RequestBlocks(int64_t id, KeySource s) : seq_id(id), source(std::move(s)) {}
  int64_t seq_id;
  KeySource source;
  std::vector<int64_t> keys;   // keys of blocks 0 .. keys.size() - 1, kept across preemptions
  std::vector<int32_t> table;  // block ids, in token order
  int32_t num_cached_blocks = 0;  // leading blocks of the table that are in the cache
  // A unique prompt's earlier tables, their cached part (private prefix caching).
  std::vector<std::vector<int32_t>> cached_tables;
};

class BlockPool {
 public:
  BlockPool(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching)
      : num_blocks_(num_blocks),
        block_size_(block_size),
        caching_(enable_prefix_caching),
        queue_(num_blocks),
        index_(num_blocks),
        blocks_(size_t(num_blocks)) {
    if (num_blocks < 1) throw std::invalid_argument("num_blocks must be positive");
    if (block_size < 1) throw std::invalid_argument("block_size must be positive");
  }

  // --- requests ---------------------------------------------------------------------------

  int32_t add_request(int64_t seq_id, KeySource source) {
    int32_t r;
    if (!free_handles_.empty()) {
      r = free_handles_.back();
      free_handles_.pop_back();
      requests_[size_t(r)].emplace(seq_id, std::move(source));
    } else {
      r = static_cast<int32_t>(requests_.size());
      requests_.emplace_back(std::in_place, seq_id, std::move(source));
    }
    return r;
  }

  // add_request of a token-keyed request (``tokens``: its prompt's ids).
  int32_t add_token_request(int64_t seq_id, const int64_t* tokens, int32_t n) {
    return add_request(seq_id, KeySource::tokens(seq_id, std::vector<int64_t>(tokens, tokens + n)));
  }
  // add_request of a prompt described by a trace's hash ids (HashIdPrefix); none: a
  // unique prompt, as prefix_from_hash_ids makes it.
  int32_t add_hash_id_request(int64_t seq_id, int32_t num_prompt_tokens, const int64_t* ids,
                              int32_t num_ids, int32_t hash_block_size) {
    if (num_ids == 0) return add_unique_request(seq_id, num_prompt_tokens);
    const std::vector<int64_t> hash_ids(ids, ids + num_ids);
    return add_request(seq_id,
                       KeySource::hash_ids(seq_id, num_prompt_tokens, hash_ids, hash_block_size));
  }
  // add_request of a prompt nobody shares (UNIQUE_PREFIX; ``seq_id`` must be unique).
  int32_t add_unique_request(int64_t seq_id, int32_t num_prompt_tokens) {
    return add_request(seq_id, KeySource::unique(seq_id, num_prompt_tokens));
  }

  // Forget request ``r`` (it must hold no blocks); its handle may be reused.
  void remove_request(int32_t r) {
    if (!request(r).table.empty()) throw std::logic_error("the request still holds blocks");
    requests_[size_t(r)].reset();
    free_handles_.push_back(r);
  }

  // Tokens generated for ``r`` (their ids matter only to a token-keyed request).
  void append_tokens(int32_t r, const int64_t* ids, int32_t n) {
    request(r).source.append_tokens(ids, n);
  }

  const RequestBlocks& get(int32_t r) const {
    if (r < 0 || size_t(r) >= requests_.size() || !requests_[size_t(r)])
      throw std::out_of_range("no such request handle");
    return *requests_[size_t(r)];
  }

  // --- queries ----------------------------------------------------------------------------

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  bool enable_prefix_caching() const { return caching_; }
  // Free blocks, evictable cached ones included.
  int32_t num_free_blocks() const { return queue_.size(); }
  // Free blocks that keep their key (a hit takes them back without computing anything).
  int32_t num_cached_free_blocks() const { return num_cached_free_; }
  int64_t num_evictions() const { return num_evictions_; }
  int32_t ref_count(int32_t b) const { return blocks_.at(size_t(b)).ref; }
  int64_t owner(int32_t b) const { return blocks_.at(size_t(b)).owner; }
  bool has_key(int32_t b) const { return blocks_.at(size_t(b)).has_key != 0; }
  int64_t block_key(int32_t b) const { return blocks_.at(size_t(b)).key; }
  std::vector<int32_t> free_queue() const { return queue_.to_vector(); }

  // --- per request ------------------------------------------------------------------------

  // ``r``'s chained keys of its first ``num_blocks`` blocks (ensure_block_hashes), made now
  // if needed; the offloading connector names its chunks by them.
  const std::vector<int64_t>& block_keys(int32_t r, int32_t num_blocks) {
    RequestBlocks& q = request(r);
    q.source.extend_keys(q.keys, num_blocks, block_size_);
    return q.keys;
  }

  // The blocks of ``r``'s longest cached prefix, at most num_tokens - 1 tokens (the last
  // token is always recomputed, for its logits); nothing without caching.
  void find_cached_prefix(int32_t r, std::vector<int32_t>& hits) {
    hits.clear();
    if (!caching_) return;
    RequestBlocks& q = request(r);
    if (!q.source.shared()) return find_private_prefix(q, hits);
    const int32_t max_blocks = (q.source.num_tokens() - 1) / block_size_;
    for (int32_t i = 0; i < max_blocks; ++i) {
      if (size_t(i) >= q.keys.size()) {
        // Most lookups miss early: make keys a few at a time.
        const int32_t want = std::max<int32_t>(2 * int32_t(q.keys.size()), 8);
        q.source.extend_keys(q.keys, std::min(max_blocks, want), block_size_);
      }
      const int32_t b = index_.lookup(q.keys[size_t(i)]);
      if (b < 0) return;
      hits.push_back(b);
    }
  }

  // vLLM's KVCacheManager.allocate_slots: give ``r`` blocks for its ``num_computed_tokens``,
  // its prefix hit ``hits`` and ``num_new_tokens`` more, and cache the full blocks those
  // tokens fill. An admission passes ``full_sequence_tokens`` > 0: it then fails unless
  // blocks for that many tokens fit too. ``max_model_len`` < 0: no limit. Returns false (and
  // changes nothing) when the free blocks less ``watermark_blocks`` do not suffice.
  // With a KV connector (engine/v1/offloading_scheduler.py): ``external_tokens`` a load
  // will bring count as computed, the new blocks must leave ``reserved_blocks`` free, and
  // ``cache`` false leaves the blocks uncached (a load's are cached when it completes).
  bool allocate_slots(int32_t r, int32_t num_computed_tokens, int32_t num_new_tokens,
                      const int32_t* hits, int32_t num_hits, int32_t full_sequence_tokens,
                      int32_t watermark_blocks, int32_t max_model_len,
                      int32_t external_tokens = 0, int32_t reserved_blocks = 0,
                      bool cache = true) {
    RequestBlocks& q = request(r);
    const int32_t bs = block_size_;
    const int32_t held = num_hits + int32_t(q.table.size());
    int32_t total_computed = num_computed_tokens + num_hits * bs + external_tokens;
    if (max_model_len >= 0 && total_computed > max_model_len) total_computed = max_model_len;
    int32_t evictable = 0;  // hits on free cached blocks: they leave the free count
    for (int32_t i = 0; i < num_hits; ++i) evictable += blocks_[size_t(hits[i])].ref == 0;
    const int32_t available = num_free_blocks() - watermark_blocks;
    if (full_sequence_tokens) {
      const int32_t need = std::max(ceil_blocks(full_sequence_tokens) - held, 0) + evictable;
      if (need > available) return false;
    }
    int32_t num_slots = total_computed + num_new_tokens;
    if (max_model_len >= 0 && num_slots > max_model_len) num_slots = max_model_len;
    const int32_t num_new_blocks = ceil_blocks(num_slots) - held;
    if (std::max(num_new_blocks, 0) + evictable > available - reserved_blocks) return false;
    if (num_hits) {
      touch(q, hits, num_hits);
      q.table.insert(q.table.end(), hits, hits + num_hits);
      q.num_cached_blocks = num_hits;
      if (record_events)
        events.record(kPrefixHit, q.seq_id, num_free_blocks(), hits, size_t(num_hits),
                      num_hits * bs);
    }
    if (num_new_blocks > 0) {
      const size_t first = q.table.size();
      for (int32_t i = 0; i < num_new_blocks; ++i) {
        const int32_t b = queue_.pop_front();
        blocks_[size_t(b)].ref = 1;
        q.table.push_back(b);
      }
      const int32_t* taken = q.table.data() + first;
      evict_taken(taken, size_t(num_new_blocks));
      for (int32_t i = 0; i < num_new_blocks; ++i) blocks_[size_t(taken[i])].owner = q.seq_id;
      if (record_events) {
        const int32_t num_free = num_free_blocks();
        if (full_sequence_tokens) {
          events.record(kAllocate, q.seq_id, num_free, taken, size_t(num_new_blocks), num_slots);
        } else {
          // APPEND_BLOCK per block, each counting the free blocks after its own take
          for (int32_t i = 0; i < num_new_blocks; ++i)
            events.record(kAppendBlock, q.seq_id, num_free + num_new_blocks - 1 - i, taken + i,
                          1, 1);
        }
      }
    } else if (full_sequence_tokens && record_events) {
      events.record(kAllocate, q.seq_id, num_free_blocks(), nullptr, 0, num_slots);
    }
    if (caching_ && cache) {
      int32_t num_cacheable = total_computed + num_new_tokens;
      if (num_cacheable > q.source.num_tokens()) num_cacheable = q.source.num_tokens();
      cache_blocks(r, num_cacheable);
    }
    return true;
  }

  // Cache ``r``'s full blocks among its first ``num_tokens`` tokens not cached yet, under
  // their chained keys (a scheduled step that fills blocks without allocating any).
  void cache_blocks(int32_t r, int32_t num_tokens) {
    RequestBlocks& q = request(r);
    const int32_t num_full = num_tokens / block_size_;
    const int32_t start = q.num_cached_blocks;
    if (start >= num_full) return;
    if (size_t(num_full) > q.table.size())
      throw std::logic_error("caching blocks the request does not hold");
    q.source.extend_keys(q.keys, num_full, block_size_);
    const bool is_private = !q.source.shared();
    for (int32_t i = start; i < num_full; ++i) {
      const int32_t b = q.table[size_t(i)];
      const int64_t key = q.keys[size_t(i)];
      if (is_private) {
        // Only its own resume can hit it: kept out of the map, ordered by a clock instead.
        blocks_[size_t(b)].is_private = 1;
        blocks_[size_t(b)].cached_at = cache_clock_ + (i - start);
      } else {
        index_.insert(key, b);
      }
      blocks_[size_t(b)].key = key;
      blocks_[size_t(b)].has_key = 1;
    }
    cache_clock_ += num_full - start;
    q.num_cached_blocks = num_full;
    if (record_events && prefix_cache_events) {
      events.record(kCache, q.seq_id, num_free_blocks(), q.table.data() + start,
                    size_t(num_full - start), start);
      events.record_hashes(q.keys.data() + start, size_t(num_full - start));
    }
  }

  // Drop ``r``'s references, its table walked in reverse: blocks that reach 0 go to the
  // front of the free queue without a key (as a group, in that order), to the back with one.
  // A ``preempted`` unique prompt remembers its cached blocks. Nothing held: a no-op.
  void free(int32_t r, bool preempted) {
    RequestBlocks& q = request(r);
    std::vector<int32_t>& table = q.table;
    if (table.empty()) {
      q.num_cached_blocks = 0;
      return;
    }
    for (const int32_t b : table)
      if (blocks_[size_t(b)].ref <= 0) throw std::logic_error("freeing a block already free");
    if (preempted && !q.source.shared() && q.num_cached_blocks)
      q.cached_tables.emplace_back(table.begin(), table.begin() + q.num_cached_blocks);
    q.num_cached_blocks = 0;
    front_.clear();
    int32_t num_cached = 0;
    for (size_t i = table.size(); i-- > 0;) {
      const int32_t b = table[i];
      if (--blocks_[size_t(b)].ref) continue;  // another request still holds it
      blocks_[size_t(b)].owner = kFreeOwner;
      if (blocks_[size_t(b)].has_key) {
        // Evictable: last in the queue, so cached blocks go least recently freed first.
        queue_.push_back(b);
        ++num_cached;
      } else {
        front_.push_back(b);
      }
    }
    queue_.push_front(front_.data(), front_.size());
    num_cached_free_ += num_cached;
    if (record_events)
      events.record(kFree, q.seq_id, num_free_blocks(), table.data(), table.size(), 0);
    table.clear();
  }

  // Forget every cached block (vLLM's reset_prefix_cache): only when no block is held;
  // returns whether it did.
  bool reset_prefix_cache() {
    if (num_free_blocks() != num_blocks_) return false;
    if (!caching_) return true;
    index_.clear();
    for (BlockState& s : blocks_) s.has_key = s.is_private = 0;
    num_cached_free_ = 0;
    if (record_events && prefix_cache_events)
      events.record(kCacheReset, kNoSeq, num_blocks_, nullptr, 0, 0);
    return true;
  }

  EventBuffer events;
  bool record_events = true;  // false: as the Python path with no event sink
  // false: no CACHE, EVICT or CACHE_RESET rows (EventRecorder(prefix_cache_events=False))
  bool prefix_cache_events = true;

 private:
  RequestBlocks& request(int32_t r) { return const_cast<RequestBlocks&>(get(r)); }

  int32_t ceil_blocks(int32_t num_tokens) const {
    return (num_tokens + block_size_ - 1) / block_size_;
  }

  // Hits gain a reference; a free (evictable cached) one leaves the queue from the middle.
  void touch(const RequestBlocks& q, const int32_t* hits, int32_t n) {
    for (int32_t i = 0; i < n; ++i) {
      const size_t b = size_t(hits[i]);
      if (blocks_[b].ref == 0) {
        queue_.remove(hits[i]);
        --num_cached_free_;
        blocks_[b].owner = q.seq_id;
      }
      ++blocks_[b].ref;
    }
  }

  // The cached ones among blocks just taken from the queue lose their keys (EVICT).
  void evict_taken(const int32_t* taken, size_t n) {
    evicted_.clear();
    evicted_keys_.clear();
    for (size_t i = 0; i < n; ++i) {
      const int32_t b = taken[i];
      if (!blocks_[size_t(b)].has_key) continue;
      const int64_t key = blocks_[size_t(b)].key;
      blocks_[size_t(b)].has_key = 0;
      if (blocks_[size_t(b)].is_private) {
        blocks_[size_t(b)].is_private = 0;
      } else {
        index_.erase(key, b);
      }
      evicted_.push_back(b);
      evicted_keys_.push_back(key);
    }
    if (evicted_.empty()) return;
    num_cached_free_ -= int32_t(evicted_.size());
    num_evictions_ += int64_t(evicted_.size());
    if (record_events && prefix_cache_events) {
      events.record(kEvict, kNoSeq, num_free_blocks(), evicted_.data(), evicted_.size(), 0);
      events.record_hashes(evicted_keys_.data(), evicted_keys_.size());
    }
  }

  // find_cached_prefix of a unique prompt, which only its own earlier tables can serve:
  // index by index, the earliest-cached block still carrying its key (what the map would
  // return, were such blocks in it).
  void find_private_prefix(RequestBlocks& q, std::vector<int32_t>& hits) {
    if (q.cached_tables.empty()) return;
    size_t longest = 0;
    for (const auto& t : q.cached_tables) longest = std::max(longest, t.size());
    const int32_t max_blocks =
        std::min<int32_t>((q.source.num_tokens() - 1) / block_size_, int32_t(longest));
    q.source.extend_keys(q.keys, max_blocks, block_size_);
    for (int32_t i = 0; i < max_blocks; ++i) {
      const int64_t key = q.keys[size_t(i)];
      int32_t best = -1;
      for (const auto& t : q.cached_tables) {
        if (size_t(i) >= t.size()) continue;
        const int32_t b = t[size_t(i)];
        const BlockState& s = blocks_[size_t(b)];
        const bool ours = s.has_key && s.is_private && s.key == key;
        if (ours && (best < 0 || s.cached_at < blocks_[size_t(best)].cached_at)) best = b;
      }
      if (best < 0) return;
      hits.push_back(best);
    }
  }

  int32_t num_blocks_;
  int32_t block_size_;
  bool caching_;
  FreeQueue queue_;
  PrefixIndex index_;
  // What the pool knows of one block, in one 32-byte record rather than six arrays: taking,
  // caching and freeing a block read and write several of these together, and at small block
  // sizes the blocks are scattered over a large pool, so one cache line per block instead of
  // up to six is most of what these operations cost.
  struct alignas(32) BlockState {
    int64_t owner = kFreeOwner;  // seq_id holding the block first (kFreeOwner: free)
    int64_t key = 0;             // the key of a block that has one
    int64_t cached_at = 0;       // a private block's place in caching order
    int32_t ref = 0;             // references held by requests
    uint8_t has_key = 0;         // cached: in the map, or private
    uint8_t is_private = 0;      // cached outside the map (a unique prompt's)
  };
  std::vector<BlockState> blocks_;  // by block id
  int64_t cache_clock_ = 0;
  int32_t num_cached_free_ = 0;
  int64_t num_evictions_ = 0;
  std::vector<std::optional<RequestBlocks>> requests_;
  std::vector<int32_t> free_handles_;
  std::vector<int32_t> front_, evicted_;  // scratch, reused across calls
  std::vector<int64_t> evicted_keys_;
};

}  // namespace kvsim
