// The CPU tier: chunk slots, ref counts and a cache policy, compiled. A mirror of
// engine/offload/cpu_manager.py's CPUOffloadManager (vLLM 0.33's CPUOffloadingManager,
// vllm/v1/kv_offload/cpu/manager.py, store_threshold 0), whose docstring is the
// specification; each method names the one it mirrors. The per-request access record
// (RequestContext) lives here, keyed by the request's id: the Python manager keeps it in the
// connector's request state. tests/engine/test_compiled_offload_tier.py holds both equal.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "arc_policy.hpp"
#include "offload_policies.hpp"
#include "tier_request.hpp"

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
      auto lru = std::make_unique<LruPolicy>(num_chunks);
      lru_ = lru.get();
      policy_ = std::move(lru);
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

  // --- per-request records (RequestContext, tier_request.hpp) ------------------------------
  // ctx.positions[keys[i]] = first + i * step (the connector's _update_offload_keys)
  void add_positions(int64_t req, const OffloadKey* keys, size_t n, int64_t first, int64_t step) {
    TierRequest& ctx = request(req, TierRequest::kKeyed);
    for (size_t i = 0; i < n; ++i)
      ctx.positions[size_t(ctx.record_of(keys[i]))] = first + int64_t(i) * step;
  }
  // The same for the request's chunks ``first_index`` on (the connector's key list from
  // there; records by index, tier_request.hpp): the records up to ``first_index`` exist.
  void add_positions_at(int64_t req, size_t first_index, const OffloadKey* keys, size_t n,
                        int64_t first, int64_t step) {
    TierRequest& ctx = request(req, TierRequest::kIndexed);
    if (first_index != size_t(ctx.size()))
      throw std::logic_error("request " + std::to_string(req) + "'s chunk " +
                             std::to_string(first_index) + " is not its next");
    for (size_t i = 0; i < n; ++i) ctx.append(keys[i], first + int64_t(i) * step);
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
    TierRequest& ctx = request(req, TierRequest::kKeyed);
    load(ctx, keys, n, [&](size_t i) { return ctx.record_of(keys[i]); });
  }
  // The same for the request's chunks ``first_index`` to ``first_index + n``.
  void prepare_load_at(int64_t req, size_t first_index, size_t n) {
    TierRequest& ctx = indexed(req, first_index + n);
    load(ctx, ctx.keys.data() + first_index, n,
         [&](size_t i) { return int32_t(first_index + i); });
  }

  void complete_load(const OffloadKey* keys, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if (i + kAhead < n) policy_->prefetch(keys[i + kAhead]);
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
    TierRequest& ctx = request(req, TierRequest::kKeyed);
    const auto rec = [&](size_t i) { return ctx.record_of(keys[i]); };
    return lru_ ? store(*lru_, ctx, keys, n, rec, to_store, evicted)
                : store(*policy_, ctx, keys, n, rec, to_store, evicted);
  }
  // The same for the request's chunks ``first_index`` to ``first_index + n``.
  bool prepare_store_at(int64_t req, size_t first_index, size_t n,
                        std::vector<OffloadKey>& to_store, std::vector<OffloadKey>& evicted) {
    TierRequest& ctx = indexed(req, first_index + n);
    const auto rec = [&](size_t i) { return int32_t(first_index + i); };
    const OffloadKey* keys = ctx.keys.data() + first_index;
    return lru_ ? store(*lru_, ctx, keys, n, rec, to_store, evicted)
                : store(*policy_, ctx, keys, n, rec, to_store, evicted);
  }

  // complete_store: the stores of ``keys`` completed; returns how many became ready.
  int64_t complete_store(const OffloadKey* keys, size_t n) {
    const int64_t stored = policy_->complete_stores(keys, n);
    num_write_pending -= stored;
    num_evictable += stored;
    num_stored += stored;
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
    TierRequest& ctx = *found->second;
    if (ctx.finished) return;
    ctx.finished = true;
    std::vector<OffloadKey>& keys = finish_keys_;
    keys.clear();
    std::vector<std::pair<int64_t, OffloadKey>>& by_position = by_position_;  // (position, key)
    by_position.clear();
    bool all_placed = true;
    for (const int32_t r : ctx.seen_order) {
      keys.push_back(ctx.keys[size_t(r)]);
      const int64_t position = ctx.positions[size_t(r)];
      if (position == kNoPosition) all_placed = false;
      if (all_placed) by_position.emplace_back(position, keys.back());
    }
    if (all_placed) {  // every key has a position: sort by it
      const auto by_first = [](const auto& a, const auto& b) { return a.first < b.first; };
      // (most requests touch their chunks in prompt order: already sorted)
      if (!std::is_sorted(by_position.begin(), by_position.end(), by_first)) {
        std::stable_sort(by_position.begin(), by_position.end(), by_first);
        for (size_t i = 0; i < keys.size(); ++i) keys[i] = by_position[i].second;
      }
    }
    KeySet insertion_only, reused;
    if (policy_->reads_access_sets()) {
      for (int32_t r = 0; r < ctx.size(); ++r) {
        const uint8_t m = ctx.marks[size_t(r)];
        if (m & TierRequest::kReused) {
          reused.insert(ctx.keys[size_t(r)]);
        } else if (m & TierRequest::kInserted) {
          insertion_only.insert(ctx.keys[size_t(r)]);
        }
      }
    }
    policy_->on_request_finished(keys, insertion_only, reused);
    if (ctx.lru_rank >= 0) policy_->on_request_done(ctx.lru_rank);
    if (spare_.size() < kSpares) {
      found->second->reset();
      spare_.push_back(std::move(found->second));
    }
    requests_.erase(found);
  }

  void held_keys(std::vector<OffloadKey>& out) const { policy_->held_keys(out); }
  size_t num_requests() const { return requests_.size(); }

 private:
  // The request's record, made on first use and addressed in ``mode``.
  TierRequest& request(int64_t req, TierRequest::Mode mode) {
    std::unique_ptr<TierRequest>& slot = requests_[req];
    if (!slot) {
      if (spare_.empty()) {
        slot = std::make_unique<TierRequest>();
      } else {
        slot = std::move(spare_.back());
        spare_.pop_back();
      }
    }
    slot->use(mode);
    return *slot;
  }
  // An indexed request whose records reach ``end``.
  TierRequest& indexed(int64_t req, size_t end) {
    TierRequest& ctx = request(req, TierRequest::kIndexed);
    if (end > size_t(ctx.size()))
      throw std::logic_error("request " + std::to_string(req) + " has no chunk " +
                             std::to_string(end - 1) + " yet");
    return ctx;
  }

  // prepare_load over ``keys``, keys[i] being record rec(i) of ``ctx``.
  template <class Rec>
  void load(TierRequest& ctx, const OffloadKey* keys, size_t n, Rec rec) {
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
    // _record_access(keys, reused=keys): every key is held
    recorded_.clear();
    for (size_t i = 0; i < n; ++i) recorded_.push_back({rec(i), true});
    record_access(ctx);
    for (const Recorded& r : recorded_) mark_reused(ctx, r.record);
  }

  // prepare_store over ``keys``, keys[i] being record rec(i) of ``ctx``. ``policy`` is
  // policy_, as its own class where that is LRU (final): the calls per chunk (prefetch, get,
  // insert) are then direct ones, not virtual.
  template <class Policy, class Rec>
  bool store(Policy& policy, TierRequest& ctx, const OffloadKey* keys, size_t n, Rec rec,
             std::vector<OffloadKey>& to_store, std::vector<OffloadKey>& evicted) {
    to_store.clear();
    evicted.clear();
    store_records_.clear();
    ready_existing_.clear();
    recorded_.clear();
    for (size_t i = 0; i < n; ++i) {
      if (i + kAhead < n) policy.prefetch(keys[i + kAhead]);
      const TierChunk* chunk = policy.get(keys[i]);
      if (chunk == nullptr) {
        to_store.push_back(keys[i]);
        store_records_.push_back(rec(i));
        recorded_.push_back({store_records_.back(), false});
      } else if (chunk->is_ready()) {
        ready_existing_.push_back(keys[i]);
        recorded_.push_back({rec(i), true});
      }
    }
    if (policy_->learns_from_store_misses()) {
      // ARC learns from its ghost lists before insert() drops the ghost entry
      std::vector<OffloadKey>& new_misses = new_misses_;
      new_misses.clear();
      for (const int32_t r : store_records_)
        if (!(ctx.marks[size_t(r)] & TierRequest::kStoreMiss))
          new_misses.push_back(ctx.keys[size_t(r)]);
      if (!new_misses.empty()) {
        policy_->on_store_miss(new_misses);
        for (const int32_t r : store_records_) ctx.marks[size_t(r)] |= TierRequest::kStoreMiss;
      }
    }
    record_access(ctx);
    for (const Recorded& r : recorded_)
      if (r.held) mark_reused(ctx, r.record);
    if (to_store.empty()) return true;
    const int64_t to_evict = int64_t(to_store.size()) - num_free();
    if (to_evict > 0) {
      if (to_evict > num_evictable) return false;
      // A chunk offered by this very store stays: it was already stored. Only a ready one
      // can be evicted, and the offered ready ones are ready_existing: no set of all offered.
      protect_.clear();
      protect_.insert(ready_existing_.begin(), ready_existing_.end());
      victims_.clear();
      if (!policy_->evict(to_evict, protect_, victims_)) return false;
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
      // (the slots the first walk brought may have left the cache during the evictions)
      if (i + kAhead < to_store.size()) policy.prefetch(to_store[i + kAhead]);
      TierChunk chunk;
      if (int64_t(i) < fresh) {
        chunk.chunk_id = int32_t(num_allocated_ + int64_t(i));
      } else {
        chunk.chunk_id = free_slots_.back();
        free_slots_.pop_back();
      }
      const int32_t r = store_records_[i];
      policy.insert(to_store[i], chunk, ctx.positions[size_t(r)], ctx.lru_rank);
    }
    num_allocated_ += fresh;
    num_write_pending += int64_t(to_store.size());
    for (const int32_t r : store_records_) ctx.marks[size_t(r)] |= TierRequest::kInserted;
    return true;
  }

  // _record_access over recorded_: the records ``ctx`` touches for the first time go to the
  // policy. (All are taken before any is marked: a key named twice is new twice, as in
  // Python's list of the keys not seen.)
  void record_access(TierRequest& ctx) {
    held_new_.clear();
    size_t num_new = 0;
    for (const Recorded& r : recorded_) {
      if (ctx.marks[size_t(r.record)] & TierRequest::kSeen) continue;
      ++num_new;
      ctx.seen_order.push_back(r.record);
      if (r.held) held_new_.emplace_back(ctx.keys[size_t(r.record)], ctx.positions[size_t(r.record)]);
    }
    if (num_new == 0) return;
    for (size_t i = ctx.seen_order.size() - num_new; i < ctx.seen_order.size(); ++i)
      ctx.marks[size_t(ctx.seen_order[i])] |= TierRequest::kSeen;
    policy_->on_request_access(held_new_, ctx.lru_rank);
  }
  // re-reading a chunk this request stored is not a second access
  static void mark_reused(TierRequest& ctx, int32_t r) {
    uint8_t& m = ctx.marks[size_t(r)];
    if (!(m & TierRequest::kInserted)) m |= TierRequest::kReused;
  }

  struct Recorded {
    int32_t record;
    bool held;  // ready and held (ready_existing, or loaded); else about to be stored
  };

  int64_t num_chunks_;
  int64_t num_allocated_ = 0;  // slots ever handed out; freed ones wait in free_slots_
  std::vector<int32_t> free_slots_;
  std::unique_ptr<TierPolicy> policy_;
  LruPolicy* lru_ = nullptr;  // policy_, when it is LRU
  std::unordered_map<int64_t, std::unique_ptr<TierRequest>> requests_;
  std::vector<std::unique_ptr<TierRequest>> spare_;  // finished records, for reuse
  static constexpr size_t kSpares = 64;
  static constexpr size_t kAhead = 16;  // how far ahead a walk over keys prefetches
  // scratch of prepare_store, record_access and on_request_finished
  std::vector<OffloadKey> ready_existing_, new_misses_, finish_keys_;
  std::vector<int32_t> store_records_;
  std::vector<Recorded> recorded_;
  std::vector<std::pair<OffloadKey, int64_t>> held_new_;
  std::vector<std::pair<int64_t, OffloadKey>> by_position_;
  KeySet protect_;
  std::vector<std::pair<OffloadKey, TierChunk>> victims_;
};

}  // namespace kvsim
