// The LRU tier's eviction order (offload_policies.hpp, LruPolicy): its evictable chunks'
// (rank, key) entries, smallest first, as one min-heap over them would give them, with stale
// entries (a chunk re-ranked, pinned or dropped since) left for the caller to skip. Three
// places hold the entries, because of how ranks are given (policies.py's _rank:
// (request rank, -position), packed in one int):
//
// - a stack per request rank: a running request's chunks become evictable head first, so each
//   pushes a smaller rank than the last (its back is its smallest), and when the request
//   finishes every one of them is re-ranked, so its stack is dropped whole (``drop``);
// - a queue of fresh ranks: a re-rank at a request's finish takes a rank larger than any
//   given before, so the queue stays in rank order;
// - a heap for what fits neither.
//
// On the whole Mooncake conversation trace (8.6 M chunks stored and evicted) one heap took a
// push and a stale pop per chunk, about a tenth of the offload run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <utility>
#include <vector>

namespace kvsim {

class LruOrder {
 public:
  using Entry = std::pair<int64_t, int64_t>;  // (rank, key): the tuple's order

  size_t size() const { return heap_.size() + fresh_.size() + num_in_stacks_; }

  // An entry of any rank: onto its request's stack when it is smaller than the stack's
  // back, else into the heap.
  void push(int64_t rank, int64_t key) {
    // (a job's chunks, stored together, are pushed in a row: the map is asked once for them)
    if (major(rank) != cached_major_) {
      cached_major_ = major(rank);
      cached_stack_ = &stacks_[cached_major_];
    }
    std::vector<Entry>& stack = *cached_stack_;
    if (stack.empty() || Entry(rank, key) < stack.back()) {
      stack.emplace_back(rank, key);
      ++num_in_stacks_;
    } else {
      heap_.emplace(rank, key);
    }
  }
  // An entry of a rank larger than any pushed before.
  void push_fresh(int64_t rank, int64_t key) { fresh_.emplace_back(rank, key); }
  // An entry back into the order (one taken out and not used).
  void push_back_taken(const Entry& e) { heap_.push(e); }

  // The smallest entry, taken out; false if there is none. Each place gives its own
  // smallest, and a stack of a smaller request rank holds only smaller ranks.
  bool pop_min(Entry& out) {
    while (!stacks_.empty() && stacks_.begin()->second.empty()) {
      if (stacks_.begin()->first == cached_major_) cached_major_ = kNone;
      stacks_.erase(stacks_.begin());
    }
    int source = -1;  // 0 heap, 1 stacks, 2 fresh
    if (!heap_.empty()) {
      source = 0;
      out = heap_.top();
    }
    if (!stacks_.empty() && (source < 0 || stacks_.begin()->second.back() < out)) {
      source = 1;
      out = stacks_.begin()->second.back();
    }
    if (!fresh_.empty() && (source < 0 || fresh_.front() < out)) {
      source = 2;
      out = fresh_.front();
    }
    if (source == 0) {
      heap_.pop();
    } else if (source == 1) {
      stacks_.begin()->second.pop_back();
      --num_in_stacks_;
    } else if (source == 2) {
      fresh_.pop_front();
    }
    return source >= 0;
  }

  // The key ``ahead`` entries behind the queue's head (the next victims usually come from
  // there), or false.
  bool fresh_ahead(size_t ahead, int64_t& key) const {
    if (fresh_.size() <= ahead) return false;
    key = fresh_[ahead].second;
    return true;
  }

  // The key ``ahead`` entries above the back of the stack of the smallest request rank, or
  // false (the victims come from there while an old request runs).
  bool stack_ahead(size_t ahead, int64_t& key) const {
    if (stacks_.empty()) return false;
    const std::vector<Entry>& stack = stacks_.begin()->second;
    if (stack.size() <= ahead) return false;
    key = stack[stack.size() - 1 - ahead].second;
    return true;
  }

  // Request rank ``major`` finished and every chunk ranked under it was re-ranked: its
  // stack's entries are all stale.
  void drop(int64_t major) {
    const auto found = stacks_.find(major);
    if (found == stacks_.end()) return;
    num_in_stacks_ -= found->second.size();
    if (major == cached_major_) cached_major_ = kNone;
    stacks_.erase(found);
  }

  // Only ``live`` entries remain (the stale ones piled up).
  void rebuild(std::vector<Entry> live) {
    heap_ = decltype(heap_)(std::greater<Entry>(), std::move(live));
    fresh_.clear();
    stacks_.clear();
    cached_major_ = kNone;
    num_in_stacks_ = 0;
  }

 private:
  static int64_t major(int64_t rank) { return rank >> 32; }  // LruPolicy::rank's

  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap_;
  std::deque<Entry> fresh_;
  std::map<int64_t, std::vector<Entry>> stacks_;  // by request rank; smallest at the back
  size_t num_in_stacks_ = 0;
  // push's last stack (std::map's nodes stay put until erased)
  static constexpr int64_t kNone = std::numeric_limits<int64_t>::min();
  int64_t cached_major_ = kNone;
  std::vector<Entry>* cached_stack_ = nullptr;
};

}  // namespace kvsim
