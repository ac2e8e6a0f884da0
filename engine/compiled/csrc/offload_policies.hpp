// Which offloaded chunk a full CPU tier evicts: the compiled mirror of
// engine/offload/policies.py (vLLM 0.33's LRU and ARC cache policies,
// vllm/v1/kv_offload/cpu/policies/lru.py and arc.py). The Python module is the specification
// (its docstring explains both policies); each function below names the one it mirrors, and
// tests/engine/test_compiled_offload_tier.py drives both with the same operations and
// requires the same answers, victims and contents.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <list>
#include <stdexcept>
#include <utility>
#include <vector>

#include "flat_keys.hpp"
#include "lru_order.hpp"

namespace kvsim {

using OffloadKey = int64_t;
using KeySet = FlatKeySet;

// ChunkStatus: ``ref_cnt`` -1 = store in flight, 0 = ready and evictable, > 0 = pinned.
struct TierChunk {
  int32_t chunk_id = 0;
  int32_t ref_cnt = -1;
  bool is_ready() const { return ref_cnt >= 0; }
};

// RequestContext: what the tier remembers about one request.
struct TierRequest {
  FlatKeyMap<int64_t> positions;  // key -> tokens up to its chunk's end
  int64_t lru_rank = -1;                              // -1: none yet
  std::vector<OffloadKey> seen_order;
  KeySet seen, inserted, reused, store_misses;
  bool finished = false;
};

// A key -> chunk map that keeps insertion order with O(1) move-to-end (an OrderedDict).
class OrderedKeys {
 public:
  bool contains(OffloadKey key) const { return pos_.count(key) != 0; }
  size_t size() const { return order_.size(); }
  void push_back(OffloadKey key) {  // the key must not be held
    order_.push_back(key);
    pos_.emplace(key, std::prev(order_.end()));
  }
  bool erase(OffloadKey key) {
    const auto found = pos_.find(key);
    if (found == pos_.end()) return false;
    order_.erase(found->second);
    pos_.erase(found);
    return true;
  }
  void move_to_end(OffloadKey key) {
    const auto found = pos_.find(key);
    order_.splice(order_.end(), order_, found->second);
  }
  void pop_front() {
    pos_.erase(order_.front());
    order_.pop_front();
  }
  std::list<OffloadKey>::const_iterator begin() const { return order_.begin(); }
  std::list<OffloadKey>::const_iterator end() const { return order_.end(); }

 private:
  std::list<OffloadKey> order_;
  FlatKeyMap<std::list<OffloadKey>::iterator> pos_;
};

// CachePolicy: the interface both policies implement.
class TierPolicy {
 public:
  explicit TierPolicy(int64_t capacity) : capacity_(capacity) {}
  virtual ~TierPolicy() = default;
  virtual TierChunk* get(OffloadKey key) = 0;
  virtual void prefetch(OffloadKey key) const = 0;  // get(key) comes soon
  virtual void insert(OffloadKey key, TierChunk chunk, TierRequest& ctx) = 0;
  // Remove exactly ``n`` evictable chunks not in ``protect`` into ``victims`` (key, chunk);
  // false, changing nothing, if there are fewer.
  virtual bool evict(int64_t n, const KeySet& protect,
                     std::vector<std::pair<OffloadKey, TierChunk>>& victims) = 0;
  virtual void held_keys(std::vector<OffloadKey>& out) const = 0;
  virtual void on_store_miss(const std::vector<OffloadKey>&, TierRequest&) {}
  virtual void on_request_access(const std::vector<OffloadKey>&, TierRequest&) {}
  virtual void on_request_finished(const std::vector<OffloadKey>& keys, const KeySet& insertion_only,
                                   const KeySet& reused) = 0;
  // After on_request_finished, the request's rank (LRU's major; -1: it had none).
  virtual void on_request_done(int64_t) {}
  // Whether on_request_finished reads its two sets (ARC); LRU gets them empty.
  virtual bool reads_access_sets() const { return true; }
  virtual void mark_evictable(OffloadKey) {}
  virtual void mark_non_evictable(OffloadKey) {}
  virtual double target_t1_size() const { return 0.0; }

 protected:
  int64_t capacity_;
};

// LRUPolicy: ranks packed as policies.py's _rank, the evictable chunks in an LruOrder
// (lru_order.hpp) with stale entries skipped.
class LruPolicy : public TierPolicy {
 public:
  using TierPolicy::TierPolicy;

  TierChunk* get(OffloadKey key) override {
    const auto found = chunks_.find(key);
    return found == chunks_.end() ? nullptr : &found->second.chunk;
  }
  void prefetch(OffloadKey key) const override { chunks_.prefetch(key); }

  void held_keys(std::vector<OffloadKey>& out) const override {
    chunks_.for_each([&](OffloadKey key, const Entry&) { out.push_back(key); });
  }

  void insert(OffloadKey key, TierChunk chunk, TierRequest& ctx) override {
    Entry& e = chunks_[key];
    e.chunk = chunk;
    e.is_evictable = false;
    const auto position = ctx.positions.find(key);
    if (position == ctx.positions.end()) {
      e.rank = rank(++next_rank_, 0);
    } else {
      e.rank = rank(request_rank(ctx), position->second);
    }
    if (chunk.ref_cnt == 0) {
      add_evictable(key, e);
      order_.push(e.rank, key);
    }
  }

  void on_request_access(const std::vector<OffloadKey>& keys, TierRequest& ctx) override {
    const int64_t major = request_rank(ctx);
    for (const OffloadKey key : keys) {
      const auto position = ctx.positions.find(key);
      if (position == ctx.positions.end()) continue;
      const auto found = chunks_.find(key);
      if (found == chunks_.end()) continue;
      const int64_t r = rank(major, position->second);
      if (found->second.rank < r) set_rank(key, found->second, r);  // never makes it older
    }
  }

  bool reads_access_sets() const override { return false; }

  void on_request_finished(const std::vector<OffloadKey>& keys, const KeySet&,
                           const KeySet&) override {
    for (auto it = keys.rbegin(); it != keys.rend(); ++it) {  // tail first
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
    std::vector<OrderEntry>& selected = selected_;
    std::vector<OrderEntry>& passed_over = passed_over_;
    selected.clear();
    passed_over.clear();
    ++num_evict_calls_;  // stamps the chunks this call chooses
    OrderEntry top;
    while (int64_t(selected.size()) < n && pop_min(top)) {
      const auto found = chunks_.find(top.second);
      // stale: the chunk was pinned, re-ranked, dropped or already chosen
      if (found == chunks_.end() || !found->second.evictable() || found->second.rank != top.first ||
          found->second.chosen_in == num_evict_calls_)
        continue;
      if (protect.count(top.second)) {
        passed_over.push_back(top);
        continue;
      }
      selected.push_back(top);
      found->second.chosen_in = num_evict_calls_;
    }
    for (const OrderEntry& e : passed_over) order_.push_back_taken(e);
    if (int64_t(selected.size()) < n) {
      for (const OrderEntry& e : selected) order_.push_back_taken(e);
      return false;
    }
    for (const OrderEntry& e : selected) {
      const auto found = chunks_.find(e.second);
      victims.emplace_back(e.second, found->second.chunk);
      remove_evictable(found->second);
      chunks_.erase(found);
    }
    if (order_.size() > std::max<size_t>(64, 2 * num_evictable_)) {
      // stale entries pile up as ranks change: rebuild from the live ones
      std::vector<OrderEntry> live;
      live.reserve(num_evictable_);
      chunks_.for_each([&](OffloadKey key, const Entry& e) {
        if (e.evictable()) live.emplace_back(e.rank, key);
      });
      order_.rebuild(std::move(live));
    }
    return true;
  }

 private:
  struct Entry {
    TierChunk chunk;
    int64_t rank = 0;
    bool is_evictable = false;
    uint32_t chosen_in = 0;     // the evict() call that chose it (a heap entry may repeat)
    bool evictable() const { return is_evictable; }
  };
  using OrderEntry = LruOrder::Entry;

  // vLLM's rank (major, -position) as one int of the same order (policies._rank)
  static int64_t rank(int64_t major, int64_t position) {
    return (major << 32) + (int64_t{1} << 31) - position;
  }
  int64_t request_rank(TierRequest& ctx) {
    if (ctx.lru_rank < 0) ctx.lru_rank = ++next_rank_;
    return ctx.lru_rank;
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
  static constexpr size_t kAhead = 4;  // how far ahead the next victims are prefetched

  // The eviction order's smallest entry, taken out (LruOrder::pop_min), the chunks of the
  // next few victims asked of the cache
  bool pop_min(OrderEntry& out) {
    if (!order_.pop_min(out)) return false;
    OffloadKey next;
    if (order_.fresh_ahead(kAhead, next)) chunks_.prefetch(next);
    return true;
  }

 public:
  // The request of rank ``major`` finished: every chunk ranked under it was re-ranked
  // fresh (on_request_finished), so its entries are stale.
  void on_request_done(int64_t major) override { order_.drop(major); }

 private:
  // policies.py's _evictable set: a flag per chunk and a count (a rebuild of the eviction
  // order walks the chunk map: no second lookup per eviction to keep a list dense)
  void add_evictable(OffloadKey, Entry& e) {
    e.is_evictable = true;
    ++num_evictable_;
  }
  void remove_evictable(Entry& e) {
    e.is_evictable = false;
    --num_evictable_;
  }

  FlatKeyMap<Entry> chunks_;
  LruOrder order_;
  int64_t next_rank_ = 0;
  size_t num_evictable_ = 0;
  std::vector<OrderEntry> selected_, passed_over_;  // evict()'s
  uint32_t num_evict_calls_ = 0;  // wraps: a stamp 2^32 calls old is never compared
};

// ARCPolicy: T1 (seen once) and T2 (reused), ghost lists B1 and B2, an adaptive target.
class ArcPolicy : public TierPolicy {
 public:
  using TierPolicy::TierPolicy;

  TierChunk* get(OffloadKey key) override {
    const auto found = chunks_.find(key);
    return found == chunks_.end() ? nullptr : &found->second;
  }
  void prefetch(OffloadKey key) const override { chunks_.prefetch(key); }

  void held_keys(std::vector<OffloadKey>& out) const override {
    out.insert(out.end(), t1_.begin(), t1_.end());
    out.insert(out.end(), t2_.begin(), t2_.end());
  }

  double target_t1_size() const override { return target_; }

  void insert(OffloadKey key, TierChunk chunk, TierRequest&) override {
    chunks_[key] = chunk;
    t1_.push_back(key);
    b1_.erase(key);
    b2_.erase(key);
  }

  void on_store_miss(const std::vector<OffloadKey>& keys, TierRequest&) override {
    for (auto it = keys.rbegin(); it != keys.rend(); ++it) adapt_to_ghost_hit(*it);
  }

  void on_request_finished(const std::vector<OffloadKey>& keys, const KeySet& insertion_only,
                           const KeySet& reused) override {
    for (auto it = keys.rbegin(); it != keys.rend(); ++it) {
      const OffloadKey key = *it;
      if (insertion_only.count(key)) {
        // storing is not a second access: keep the list, refresh recency
        if (t1_.contains(key)) {
          t1_.move_to_end(key);
        } else if (t2_.contains(key)) {
          t2_.move_to_end(key);
        }
      } else if (reused.count(key)) {
        if (t1_.erase(key)) {
          t2_.push_back(key);
        } else if (t2_.contains(key)) {
          t2_.move_to_end(key);
        }
      }
    }
  }

  bool evict(int64_t n, const KeySet& protect,
             std::vector<std::pair<OffloadKey, TierChunk>>& victims) override {
    if (n == 0) return true;
    auto t1 = t1_.begin();
    auto t2 = t2_.begin();
    const auto next_evictable = [&](std::list<OffloadKey>::const_iterator& it,
                                    std::list<OffloadKey>::const_iterator end) -> bool {
      for (; it != end; ++it) {
        if (chunks_.at(*it).ref_cnt == 0 && !protect.count(*it)) return true;
      }
      return false;
    };
    // choose all n first (T1's size as it would shrink), then apply: all or nothing
    std::vector<std::pair<OffloadKey, bool>> chosen;  // (key, from T1)
    int64_t t1_size = int64_t(t1_.size());
    for (int64_t k = 0; k < n; ++k) {
      bool found = false, from_t1 = false;
      OffloadKey key = 0;
      if (t1_size >= int64_t(target_)) {
        if (next_evictable(t1, t1_.end())) {
          found = from_t1 = true;
          key = *t1++;
        }
      }
      if (!found && next_evictable(t2, t2_.end())) {
        found = true;
        key = *t2++;
      }
      if (!found) {
        if (!next_evictable(t1, t1_.end())) return false;
        from_t1 = true;
        key = *t1++;
      }
      if (from_t1) --t1_size;
      chosen.emplace_back(key, from_t1);
    }
    for (const auto& c : chosen) {
      if (c.second) {
        t1_.erase(c.first);
        b1_.push_back(c.first);
      } else {
        t2_.erase(c.first);
        b2_.push_back(c.first);
      }
      const auto found = chunks_.find(c.first);
      victims.emplace_back(c.first, found->second);
      chunks_.erase(found);
    }
    for (OrderedKeys* ghosts : {&b1_, &b2_})
      while (int64_t(ghosts->size()) > capacity_) ghosts->pop_front();
    return true;
  }

 private:
  void adapt_to_ghost_hit(OffloadKey key) {
    if (b1_.contains(key)) {
      const double delta = std::max(1.0, double(b2_.size()) / double(b1_.size()));
      target_ = std::min(target_ + delta, double(capacity_));
      b1_.move_to_end(key);
    } else if (b2_.contains(key)) {
      const double delta = std::max(1.0, double(b1_.size()) / double(b2_.size()));
      target_ = std::max(target_ - delta, 0.0);
      b2_.move_to_end(key);
    }
  }

  FlatKeyMap<TierChunk> chunks_;  // T1's and T2's chunks
  OrderedKeys t1_, t2_, b1_, b2_;
  double target_ = 0.0;
};

}  // namespace kvsim
