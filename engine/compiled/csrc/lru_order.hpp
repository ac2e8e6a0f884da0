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

  size_t size() const { return heap_.size() + num_fresh() + num_in_stacks_; }

  // An entry of any rank: onto its request's stack when it is smaller than the stack's
  // back, else into the heap.
  void push(int64_t rank, int64_t key) {
    // (a job's chunks, stored together, are pushed in a row: the map is asked once for them)
    if (major(rank) != cached_major_) {
      cached_major_ = major(rank);
      const auto made = stacks_.try_emplace(cached_major_);
      cached_stack_ = &made.first->second;
      if (made.second && !spare_stacks_.empty()) {  // a dropped stack's room
        cached_stack_->swap(spare_stacks_.back());
        spare_stacks_.pop_back();
      }
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
  size_t num_fresh() const { return fresh_.size() - fresh_head_; }
  // An entry back into the order (one taken out and not used).
  void push_back_taken(const Entry& e) { heap_.push(e); }

  // The smallest entry, taken out; false if there is none. Each place gives its own
  // smallest, and a stack of a smaller request rank holds only smaller ranks.
  bool pop_min(Entry& out) {
    while (!stacks_.empty() && stacks_.begin()->second.empty()) {
      if (stacks_.begin()->first == cached_major_) cached_major_ = kNone;
      erase_stack(stacks_.begin());
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
    if (num_fresh() != 0 && (source < 0 || fresh_[fresh_head_] < out)) {
      source = 2;
      out = fresh_[fresh_head_];
    }
    last_source_ = source;
    if (source == 0) {
      heap_.pop();
    } else if (source == 1) {
      stacks_.begin()->second.pop_back();
      --num_in_stacks_;
    } else if (source == 2) {
      pop_fresh();
    }
    return source >= 0;
  }

  // The key ``ahead`` entries behind the queue's head (the next victims usually come from
  // there), or false.
  bool fresh_ahead(size_t ahead, int64_t& key) const {
    if (num_fresh() <= ahead) return false;
    key = fresh_[fresh_head_ + ahead].second;
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

  // The key ``ahead`` entries on in the place the last pop_min took from (the stacks or the
  // queue: the next victims come from there), or false.
  bool last_source_ahead(size_t ahead, int64_t& key) const {
    if (last_source_ == 1) return stack_ahead(ahead, key);
    if (last_source_ == 2) return fresh_ahead(ahead, key);
    return false;
  }

  // Request rank ``major`` finished and every chunk ranked under it was re-ranked: its
  // stack's entries are all stale.
  void drop(int64_t major) {
    const auto found = stacks_.find(major);
    if (found == stacks_.end()) return;
    num_in_stacks_ -= found->second.size();
    if (major == cached_major_) cached_major_ = kNone;
    erase_stack(found);
  }

  // Only ``live`` entries remain (the stale ones piled up).
  void rebuild(std::vector<Entry> live) {
    heap_ = decltype(heap_)(std::greater<Entry>(), std::move(live));
    fresh_.clear();
    fresh_head_ = 0;
    while (!stacks_.empty()) erase_stack(stacks_.begin());
    cached_major_ = kNone;
    num_in_stacks_ = 0;
  }

 private:
  static int64_t major(int64_t rank) { return rank >> 32; }  // LruPolicy::rank's

  // The queue's head out: the vector's front is dropped in one move once it is half the
  // vector (a std::deque allocated a 512-byte block per 32 entries: the whole Mooncake trace
  // re-ranks 4.7 M chunks fresh at finishes; with this round's other allocation cuts the
  // offload run's CPU went 3.4-3.5 -> 3.3 s, docs/offload.md "Speed")
  void pop_fresh() {
    if (++fresh_head_ == fresh_.size()) {
      fresh_.clear();
      fresh_head_ = 0;
    } else if (fresh_head_ >= 4096 && 2 * fresh_head_ >= fresh_.size()) {
      fresh_.erase(fresh_.begin(), fresh_.begin() + std::ptrdiff_t(fresh_head_));
      fresh_head_ = 0;
    }
  }
  // A request's stack out, its room kept for a later request's (a stack per request rank:
  // its vector grew entry by entry each time, the whole trace's ~60 k requests)
  void erase_stack(std::map<int64_t, std::vector<Entry>>::iterator it) {
    if (spare_stacks_.size() < kSpareStacks && it->second.capacity() != 0) {
      it->second.clear();
      spare_stacks_.push_back(std::move(it->second));
    }
    stacks_.erase(it);
  }

  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap_;
  int last_source_ = -1;  // pop_min's last: 0 heap, 1 stacks, 2 queue
  std::vector<Entry> fresh_;  // the queue from fresh_head_ on
  size_t fresh_head_ = 0;
  std::vector<std::vector<Entry>> spare_stacks_;
  static constexpr size_t kSpareStacks = 64;
  std::map<int64_t, std::vector<Entry>> stacks_;  // by request rank; smallest at the back
  size_t num_in_stacks_ = 0;
  // push's last stack (std::map's nodes stay put until erased)
  static constexpr int64_t kNone = std::numeric_limits<int64_t>::min();
  int64_t cached_major_ = kNone;
  std::vector<Entry>* cached_stack_ = nullptr;
};

}  // namespace kvsim
