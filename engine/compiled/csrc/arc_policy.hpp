// vLLM 0.33's ARC cache policy for the CPU tier (vllm/v1/kv_offload/cpu/policies/arc.py),
// compiled: the mirror of engine/offload/policies.py's ARCPolicy, whose docstring is the
// specification (the interface, TierPolicy, and LRU in offload_policies.hpp).
// tests/engine/test_compiled_offload_tier.py holds both equal.
#pragma once

#include <algorithm>
#include <cstdint>
#include <list>
#include <utility>
#include <vector>

#include "flat_keys.hpp"
#include "offload_policies.hpp"

namespace kvsim {

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

  void insert(OffloadKey key, TierChunk chunk, int64_t, int64_t&) override {
    chunks_[key] = chunk;
    t1_.push_back(key);
    b1_.erase(key);
    b2_.erase(key);
  }

  void on_store_miss(const std::vector<OffloadKey>& keys) override {
    for (auto it = keys.rbegin(); it != keys.rend(); ++it) adapt_to_ghost_hit(*it);
  }
  bool learns_from_store_misses() const override { return true; }

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
