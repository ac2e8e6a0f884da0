// Which offloaded chunk a full CPU tier evicts: the compiled mirror of
// engine/offload/policies.py (vLLM 0.33's LRU and ARC cache policies,
// vllm/v1/kv_offload/cpu/policies/lru.py and arc.py): the interface and LRU here, ARC in
// arc_policy.hpp. The Python module is the specification (its docstring explains both
// policies); each function below names the one it mirrors, and
// tests/engine/test_compiled_offload_tier.py drives both with the same operations and
// requires the same answers, victims and contents.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

#include "flat_keys.hpp"
#include "lru_order.hpp"
#include "tier_request.hpp"

namespace kvsim {

using KeySet = FlatKeySet;

// ChunkStatus: ``ref_cnt`` -1 = store in flight, 0 = ready and evictable, > 0 = pinned.
struct TierChunk {
  int32_t chunk_id = 0;
  int32_t ref_cnt = -1;
  bool is_ready() const { return ref_cnt >= 0; }
};

// CachePolicy: the interface both policies implement.
class TierPolicy {
 public:
  explicit TierPolicy(int64_t capacity) : capacity_(capacity) {}
  virtual ~TierPolicy() = default;
  virtual TierChunk* get(OffloadKey key) = 0;
  virtual void prefetch(OffloadKey key) const = 0;  // get(key) comes soon
  // ``position``: the key's in the request's record (kNoPosition: none); ``lru_rank``: the
  // request's (RequestContext.lru_rank, -1: none yet)
  virtual void insert(OffloadKey key, TierChunk chunk, int64_t position, int64_t& lru_rank) = 0;
  // Remove exactly ``n`` evictable chunks not in ``protect`` into ``victims`` (key, chunk);
  // false, changing nothing, if there are fewer.
  virtual bool evict(int64_t n, const KeySet& protect,
                     std::vector<std::pair<OffloadKey, TierChunk>>& victims) = 0;
  virtual void held_keys(std::vector<OffloadKey>& out) const = 0;
  virtual void on_store_miss(const std::vector<OffloadKey>&) {}
  // Whether on_store_miss does anything (ARC): the tier tracks store misses only then.
  virtual bool learns_from_store_misses() const { return false; }
  // The keys a request touches for the first time, called when there are any, with those the
  // tier holds as (key, position) pairs: the others change no policy (LRU skips keys it does
  // not hold; ARC does nothing), so the tier does not look them up again.
  virtual void on_request_access(const std::vector<std::pair<OffloadKey, int64_t>>&, int64_t&) {}
  virtual void on_request_finished(const std::vector<OffloadKey>& keys, const KeySet& insertion_only,
                                   const KeySet& reused) = 0;
  // After on_request_finished, the request's rank (LRU's major; -1: it had none).
  virtual void on_request_done(int64_t) {}
  // Whether on_request_finished reads its two sets (ARC); LRU gets them empty.
  virtual bool reads_access_sets() const { return true; }
  virtual void mark_evictable(OffloadKey) {}
  // The store of ``key`` completed: a chunk being stored becomes ready (ref 0) and evictable;
  // false if ``key`` is not held or is ready already. (One look-up where get() and
  // mark_evictable() take two.)
  virtual bool complete_store(OffloadKey key) {
    TierChunk* chunk = get(key);
    if (chunk == nullptr || chunk->is_ready()) return false;
    chunk->ref_cnt = 0;
    mark_evictable(key);
    return true;
  }
  // complete_store for each of ``keys``; how many became ready.
  virtual int64_t complete_stores(const OffloadKey* keys, size_t n) {
    int64_t stored = 0;
    for (size_t i = 0; i < n; ++i) stored += complete_store(keys[i]);
    return stored;
  }
  virtual void mark_non_evictable(OffloadKey) {}
  virtual double target_t1_size() const { return 0.0; }

 protected:
  int64_t capacity_;
};

// LRUPolicy: ranks packed as policies.py's _rank, the evictable chunks in an LruOrder
// (lru_order.hpp) with stale entries skipped.
class LruPolicy final : public TierPolicy {
 public:
  using TierPolicy::TierPolicy;

  bool complete_store(OffloadKey key) override {
    const auto found = chunks_.find(key);
    if (found == chunks_.end() || found->second.chunk.is_ready()) return false;
    Entry& e = found->second;
    e.chunk.ref_cnt = 0;
    add_evictable(key, e);
    order_.push(e.rank, key);
    return true;
  }

  // (a job's chunks in one call: no virtual call per chunk, the next ones' slots asked of
  // the cache ahead)
  int64_t complete_stores(const OffloadKey* keys, size_t n) override {
    int64_t stored = 0;
    for (size_t i = 0; i < n; ++i) {
      if (i + kAhead < n) chunks_.prefetch(keys[i + kAhead]);
      stored += LruPolicy::complete_store(keys[i]);
    }
    return stored;
  }

  TierChunk* get(OffloadKey key) override {
    const auto found = chunks_.find(key);
    return found == chunks_.end() ? nullptr : &found->second.chunk;
  }
  void prefetch(OffloadKey key) const override { chunks_.prefetch(key); }

  void held_keys(std::vector<OffloadKey>& out) const override {
    chunks_.for_each([&](OffloadKey key, const Entry&) { out.push_back(key); });
  }

  void insert(OffloadKey key, TierChunk chunk, int64_t position, int64_t& lru_rank) override {
    Entry& e = chunks_[key];
    e.chunk = chunk;
    if (position == kNoPosition) {
      e.rank = rank(++next_rank_, 0);
    } else {
      e.rank = rank(request_rank(lru_rank), position);
    }
    if (chunk.ref_cnt == 0) {
      add_evictable(key, e);
      order_.push(e.rank, key);
    }
  }

  void on_request_access(const std::vector<std::pair<OffloadKey, int64_t>>& held,
                         int64_t& lru_rank) override {
    const int64_t major = request_rank(lru_rank);  // even when no key is held
    for (const auto& kp : held) {
      const OffloadKey key = kp.first;
      if (kp.second == kNoPosition) continue;
      const auto found = chunks_.find(key);
      if (found == chunks_.end()) continue;
      const int64_t r = rank(major, kp.second);
      if (found->second.rank < r) set_rank(key, found->second, r);  // never makes it older
    }
  }

  bool reads_access_sets() const override { return false; }

  void on_request_finished(const std::vector<OffloadKey>& keys, const KeySet&,
                           const KeySet&) override {
    for (auto it = keys.rbegin(); it != keys.rend(); ++it) {  // tail first
      if (size_t(keys.rend() - it) > kAhead) chunks_.prefetch(*(it + kAhead));
      const auto found = chunks_.find(*it);
      if (found != chunks_.end()) set_fresh_rank(*it, found->second);
    }
  }

  void mark_evictable(OffloadKey key) override {
    Entry& e = chunks_.at(key);
    add_evictable(key, e);
    order_.push(e.rank, key);
  }

  void mark_non_evictable(OffloadKey key) override {
    Entry& e = chunks_.at(key);
    if (!e.evictable()) throw std::logic_error("chunk was not evictable");
    remove_evictable(e);
  }

  bool evict(int64_t n, const KeySet& protect,
             std::vector<std::pair<OffloadKey, TierChunk>>& victims) override {
    if (n == 0) return true;
    if (int64_t(num_evictable_) >= n + int64_t(protect.size())) {
      // Every evictable chunk has an entry of its rank in the order, and at most
      // protect.size() of them are protected, so the n smallest live unprotected entries
      // exist: each victim goes as it is found, without the choose-then-apply walk that an
      // all-or-nothing failure needs (a victim's duplicate entries, later, find it gone; the
      // protected ones go back as that walk puts them back). Most stores offer no chunk the
      // tier holds ready; on the whole Mooncake trace the ~12 k that do evict ~2.7 M of the
      // 8.6 M victims, and nearly all of them leave far more than n + protected evictable.
      OrderEntry top;
      passed_over_.clear();
      for (int64_t taken = 0; taken < n;) {
        if (!pop_min(top)) throw std::logic_error("the LRU order lost an evictable chunk");
        // (find_held: an eviction order's entry is nearly always live, its chunk an old one
        // at its home; the group walk cost evict() ~10% more, perf in turns)
        const auto found = chunks_.find_held(top.second);
        if (found == chunks_.end() || !found->second.evictable() || found->second.rank != top.first)
          continue;
        if (!protect.empty() && protect.count(top.second)) {
          passed_over_.push_back(top);
          continue;
        }
        victims.emplace_back(top.second, found->second.chunk);
        remove_evictable(found->second);
        chunks_.erase(found);
        ++taken;
      }
      for (const OrderEntry& e : passed_over_) order_.push_back_taken(e);
      compact_order();
      return true;
    }
    std::vector<OrderEntry>& selected = selected_;
    std::vector<OrderEntry>& passed_over = passed_over_;
    std::vector<Slot*>& slots = selected_slots_;
    selected.clear();
    passed_over.clear();
    slots.clear();
    OrderEntry top;
    while (int64_t(selected.size()) < n && pop_min(top)) {
      const auto found = chunks_.find_held(top.second);
      // stale: the chunk was pinned, re-ranked, dropped or already chosen (its rank kChosen)
      if (found == chunks_.end() || !found->second.evictable() || found->second.rank != top.first)
        continue;
      if (!protect.empty() && protect.count(top.second)) {
        passed_over.push_back(top);
        continue;
      }
      selected.push_back(top);
      slots.push_back(found);
      found->second.rank = kChosen;  // (an entry may repeat in the order)
    }
    for (const OrderEntry& e : passed_over) order_.push_back_taken(e);
    if (int64_t(selected.size()) < n) {
      for (const OrderEntry& e : selected) {
        chunks_.find(e.second)->second.rank = e.first;
        order_.push_back_taken(e);
      }
      return false;
    }
    for (size_t i = 0; i < selected.size(); ++i) {
      const OrderEntry& e = selected[i];
      // the slot found above, unless an erase before moved the entry (backward shift)
      Slot* found = slots[i];
      if (!chunks_.holds(found, e.second)) found = chunks_.find(e.second);
      victims.emplace_back(e.second, found->second.chunk);
      remove_evictable(found->second);
      chunks_.erase(found);
    }
    compact_order();
    return true;
  }

 private:
  void compact_order() {
    if (order_.size() > std::max<size_t>(64, 2 * num_evictable_)) {
      // stale entries pile up as ranks change: rebuild from the live ones
      std::vector<OrderEntry> live;
      live.reserve(num_evictable_);
      chunks_.for_each([&](OffloadKey key, const Entry& e) {
        if (e.evictable()) live.emplace_back(e.rank, key);
      });
      order_.rebuild(std::move(live));
    }
  }

 private:
  // 16 bytes: the chunk map's slots are 24 and a control byte (a 32,768-chunk tier's map,
  // 1.5 MiB, is looked up several times per chunk stored; it was 40-byte slots with a flag
  // and a stamp)
  struct Entry {
    TierChunk chunk;
    int64_t rank = 0;
    // policies.py's _evictable: ready and not pinned (mark_evictable / mark_non_evictable
    // follow ref_cnt's moves to and from 0)
    bool evictable() const { return chunk.ref_cnt == 0; }
  };
  static constexpr int64_t kChosen = std::numeric_limits<int64_t>::min();  // evict()'s mark
  using OrderEntry = LruOrder::Entry;

  // vLLM's rank (major, -position) as one int of the same order (policies._rank)
  static int64_t rank(int64_t major, int64_t position) {
    return (major << 32) + (int64_t{1} << 31) - position;
  }
  int64_t request_rank(int64_t& lru_rank) {
    if (lru_rank < 0) lru_rank = ++next_rank_;
    return lru_rank;
  }
  void set_rank(OffloadKey key, Entry& e, int64_t r) {
    e.rank = r;
    if (e.evictable()) order_.push(r, key);
  }
  // set_rank to a new request rank's, larger than every rank given before
  void set_fresh_rank(OffloadKey key, Entry& e) {
    e.rank = rank(++next_rank_, 0);
    if (e.evictable()) order_.push_fresh(e.rank, key);
  }
  // How far ahead the walks over keys prefetch; evict()'s next victims are prefetched in the
  // place (a request's stack or the fresh queue) the last one came from: a cold chunk slot
  // per victim was a third of evict(). It was 8, the victims' in both places (16 there
  // measured worse); 14 in the one (whole Mooncake trace, perf in turns with main, 3
  // rounds: the tier's samples over the GPU side's, as a share of main's, 0.66-0.67 against
  // 0.67-0.74)
  static constexpr size_t kAhead = 14;

  // The eviction order's smallest entry, taken out (LruOrder::pop_min), the chunks of the
  // next few victims asked of the cache
  bool pop_min(OrderEntry& out) {
    if (!order_.pop_min(out)) return false;
    OffloadKey next;
    if (order_.last_source_ahead(kAhead, next)) chunks_.prefetch(next);
    return true;
  }

 public:
  // The request of rank ``major`` finished: every chunk ranked under it was re-ranked
  // fresh (on_request_finished), so its entries are stale.
  void on_request_done(int64_t major) override { order_.drop(major); }

 private:
  // policies.py's _evictable set: a flag per chunk and a count (a rebuild of the eviction
  // order walks the chunk map: no second lookup per eviction to keep a list dense)
  void add_evictable(OffloadKey, Entry&) { ++num_evictable_; }
  void remove_evictable(Entry&) { --num_evictable_; }

  FlatKeyMap<Entry> chunks_;
  LruOrder order_;
  int64_t next_rank_ = 0;
  size_t num_evictable_ = 0;
  using Slot = FlatKeyMap<Entry>::Slot;
  std::vector<OrderEntry> selected_, passed_over_;  // evict()'s
  std::vector<Slot*> selected_slots_;
};

}  // namespace kvsim
