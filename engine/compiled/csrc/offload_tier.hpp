// The CPU tier: chunk slots, ref counts and a cache policy, compiled. A mirror of
// engine/offload/cpu_manager.py's CPUOffloadManager (vLLM 0.33's CPUOffloadingManager,
// vllm/v1/kv_offload/cpu/manager.py, store_threshold 0), whose docstring is the
// specification; each method names the one it mirrors. The per-request access record
// (RequestContext) lives here, keyed by the request's id: the Python manager keeps it in the
// connector's request state. tests/engine/test_compiled_offload_tier.py holds both equal.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "offload_policies.hpp"

namespace kvsim {

enum TierLookup : int8_t { kTierMiss = 0, kTierHit = 1, kTierHitPending = 2 };

class CpuTier {
 public:
  // A tier of ``num_chunks`` slots under ``arc`` (ARC) or LRU.
  CpuTier(int64_t num_chunks, bool arc) : num_chunks_(num_chunks) {
    if (num_chunks < 0) throw std::invalid_argument("num_chunks must be >= 0");
    if (arc) {
      policy_ = std::make_unique<ArcPolicy>(num_chunks);
    } else {
      policy_ = std::make_unique<LruPolicy>(num_chunks);
    }
  }

  // --- the pool ---------------------------------------------------------------------------
  int64_t num_chunks() const { return num_chunks_; }
  int64_t num_free() const {
    return int64_t(free_slots_.size()) + num_chunks_ - num_allocated_;
  }
  int64_t num_held() const { return num_chunks_ - num_free(); }
  int64_t num_evictable = 0;
  int64_t num_write_pending = 0;
  int64_t num_stored = 0;   // chunks whose store completed, over the run
  int64_t num_evicted = 0;  // chunks evicted, over the run
  const TierPolicy& policy() const { return *policy_; }

  // --- per-request records (RequestContext) -------------------------------------------------
  // ctx.positions[keys[i]] = first + i * step (the connector's _update_offload_keys)
  void add_positions(int64_t req, const OffloadKey* keys, size_t n, int64_t first, int64_t step) {
    TierRequest& ctx = requests_[req];
    // The request's sets hold at most its chunks: room for them now, not by doublings
    // (a long prompt's first lookup brings all its chunks at once)
    const size_t expected = ctx.positions.size() + n;
    ctx.positions.reserve(expected);
    ctx.seen.reserve(expected);
    ctx.inserted.reserve(expected);
    ctx.store_misses.reserve(expected);
    for (size_t i = 0; i < n; ++i) ctx.positions[keys[i]] = first + int64_t(i) * step;
  }

  // --- the manager's interface (CPUOffloadManager) ------------------------------------------
  // lookup(key) comes soon (a request's chunks are looked up in a row)
  void prefetch(OffloadKey key) const { policy_->prefetch(key); }

  TierLookup lookup(OffloadKey key) {
    const TierChunk* chunk = policy_->get(key);
    if (chunk == nullptr) return kTierMiss;
    return chunk->is_ready() ? kTierHit : kTierHitPending;
  }

  // prepare_load: pin ready chunks ``keys`` for a load.
  void prepare_load(int64_t req, const OffloadKey* keys, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      TierChunk* chunk = policy_->get(keys[i]);
      if (chunk == nullptr || !chunk->is_ready())
        throw std::invalid_argument("chunk " + std::to_string(keys[i]) + " is not ready to load");
      if (chunk->ref_cnt == 0) {
        policy_->mark_non_evictable(keys[i]);
        --num_evictable;
      }
      ++chunk->ref_cnt;
    }
    scratch_.assign(keys, keys + n);
    record_access(scratch_, requests_[req], scratch_);
  }

  void complete_load(const OffloadKey* keys, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      TierChunk* chunk = policy_->get(keys[i]);
      if (chunk == nullptr || chunk->ref_cnt <= 0)
        throw std::invalid_argument("chunk " + std::to_string(keys[i]) +
                                    " completed a load it was not pinned for");
      if (--chunk->ref_cnt == 0) {
        ++num_evictable;
        policy_->mark_evictable(keys[i]);
      }
    }
  }

  // prepare_store: insert the ``keys`` not held yet, as being stored, into ``to_store``
  // (and the keys evicted for them into ``evicted``); false (nothing changes but the
  // request's access record) when the pool cannot make room.
  bool prepare_store(int64_t req, const OffloadKey* keys, size_t n,
                     std::vector<OffloadKey>& to_store, std::vector<OffloadKey>& evicted) {
    TierRequest& ctx = requests_[req];
    to_store.clear();
    evicted.clear();
    std::vector<OffloadKey>& ready_existing = ready_existing_;
    std::vector<OffloadKey>& new_misses = new_misses_;
    std::vector<OffloadKey>& recorded = recorded_;
    ready_existing.clear();
    new_misses.clear();
    recorded.clear();
    for (size_t i = 0; i < n; ++i) {
      if (i + kAhead < n) policy_->prefetch(keys[i + kAhead]);
      const TierChunk* chunk = policy_->get(keys[i]);
      if (chunk == nullptr) {
        to_store.push_back(keys[i]);
        recorded.push_back(keys[i]);
      } else if (chunk->is_ready()) {
        ready_existing.push_back(keys[i]);
        recorded.push_back(keys[i]);
      }
    }
    for (const OffloadKey key : to_store)
      if (!ctx.store_misses.count(key)) new_misses.push_back(key);
    if (!new_misses.empty()) {
      // ARC learns from its ghost lists before insert() drops the ghost entry
      policy_->on_store_miss(new_misses, ctx);
      ctx.store_misses.insert(new_misses.begin(), new_misses.end());
    }
    record_access(recorded, ctx, ready_existing);
    if (to_store.empty()) return true;
    const int64_t to_evict = int64_t(to_store.size()) - num_free();
    if (to_evict > 0) {
      if (to_evict > num_evictable) return false;
      // a chunk offered by this very store stays: it was already stored
      const KeySet protect(keys, keys + n);
      victims_.clear();
      if (!policy_->evict(to_evict, protect, victims_)) return false;
      num_evictable -= int64_t(victims_.size());
      num_evicted += int64_t(victims_.size());
      for (const auto& v : victims_) {
        free_slots_.push_back(v.second.chunk_id);
        evicted.push_back(v.first);
      }
    }
    // _allocate: fresh slots first, then the freed ones, last freed first
    const int64_t fresh = std::min<int64_t>(int64_t(to_store.size()), num_chunks_ - num_allocated_);
    for (size_t i = 0; i < to_store.size(); ++i) {
      TierChunk chunk;
      if (int64_t(i) < fresh) {
        chunk.chunk_id = int32_t(num_allocated_ + int64_t(i));
      } else {
        chunk.chunk_id = free_slots_.back();
        free_slots_.pop_back();
      }
      policy_->insert(to_store[i], chunk, ctx);
    }
    num_allocated_ += fresh;
    num_write_pending += int64_t(to_store.size());
    ctx.inserted.insert(to_store.begin(), to_store.end());
    return true;
  }

  // complete_store: the stores of ``keys`` completed; returns how many became ready.
  int64_t complete_store(const OffloadKey* keys, size_t n) {
    int64_t stored = 0;
    for (size_t i = 0; i < n; ++i) {
      TierChunk* chunk = policy_->get(keys[i]);
      if (chunk != nullptr && !chunk->is_ready()) {
        chunk->ref_cnt = 0;
        --num_write_pending;
        ++num_evictable;
        ++num_stored;
        policy_->mark_evictable(keys[i]);
        ++stored;
      }
    }
    return stored;
  }

  // on_request_finished: the request's one access, its keys head to tail (by position);
  // its record is dropped then (nothing asks for it after).
  void on_request_finished(int64_t req) {
    const auto found = requests_.find(req);
    if (found == requests_.end()) {
      // a request the tier never heard of: an empty access (no policy changes it)
      return;
    }
    TierRequest& ctx = found->second;
    if (ctx.finished) return;
    ctx.finished = true;
    std::vector<OffloadKey> keys = std::move(ctx.seen_order);  // the record goes below
    std::vector<std::pair<int64_t, OffloadKey>> by_position;  // (position, key)
    by_position.reserve(keys.size());
    for (const OffloadKey key : keys) {
      const auto found = ctx.positions.find(key);
      if (found == ctx.positions.end()) break;
      by_position.emplace_back(found->second, key);
    }
    if (by_position.size() == keys.size()) {  // every key has a position: sort by it
      const auto by_first = [](const auto& a, const auto& b) { return a.first < b.first; };
      // (most requests touch their chunks in prompt order: already sorted)
      if (!std::is_sorted(by_position.begin(), by_position.end(), by_first)) {
        std::stable_sort(by_position.begin(), by_position.end(), by_first);
        for (size_t i = 0; i < keys.size(); ++i) keys[i] = by_position[i].second;
      }
    }
    KeySet insertion_only;
    if (policy_->reads_access_sets()) {
      ctx.inserted.for_each([&](OffloadKey key) {
        if (!ctx.reused.count(key)) insertion_only.insert(key);
      });
    }
    policy_->on_request_finished(keys, insertion_only, ctx.reused);
    if (ctx.lru_rank >= 0) policy_->on_request_done(ctx.lru_rank);
    requests_.erase(found);
  }

  void held_keys(std::vector<OffloadKey>& out) const { policy_->held_keys(out); }
  size_t num_requests() const { return requests_.size(); }

 private:
  // _record_access: the keys ``ctx`` touches for the first time go to the policy; re-reading
  // a chunk this request stored is not a second access.
  void record_access(const std::vector<OffloadKey>& keys, TierRequest& ctx,
                     const std::vector<OffloadKey>& reused) {
    std::vector<OffloadKey> new_keys;
    for (const OffloadKey key : keys)
      if (!ctx.seen.count(key)) new_keys.push_back(key);
    if (!new_keys.empty()) {
      ctx.seen.insert(new_keys.begin(), new_keys.end());
      ctx.seen_order.insert(ctx.seen_order.end(), new_keys.begin(), new_keys.end());
      policy_->on_request_access(new_keys, ctx);
    }
    for (const OffloadKey key : reused)
      if (!ctx.inserted.count(key)) ctx.reused.insert(key);
  }

  int64_t num_chunks_;
  int64_t num_allocated_ = 0;  // slots ever handed out; freed ones wait in free_slots_
  std::vector<int32_t> free_slots_;
  std::unique_ptr<TierPolicy> policy_;
  std::unordered_map<int64_t, TierRequest> requests_;
  static constexpr size_t kAhead = 4;  // how far ahead a walk over keys prefetches
  std::vector<OffloadKey> scratch_;
  std::vector<OffloadKey> ready_existing_, new_misses_, recorded_;  // prepare_store's
  std::vector<std::pair<OffloadKey, TierChunk>> victims_;
};

}  // namespace kvsim
