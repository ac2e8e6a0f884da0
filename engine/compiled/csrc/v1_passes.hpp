// The compiled v1 scheduler's two passes per step (V1Scheduler._schedule_running and
// _schedule_waiting of engine/v1/scheduler.py), defined out of line so that v1_scheduler.hpp
// reads as the class: included at its end, never on its own.
#pragma once

#include "v1_scheduler.hpp"

namespace kvsim {

// V1Scheduler._schedule_running: running requests first, in running order; returns the
// token budget left.
inline int32_t V1Scheduler::schedule_running(int32_t threshold) {
  int32_t budget = cfg_.max_num_batched_tokens;
  const int32_t bs = pool_.block_size();
  const int32_t max_len = cfg_.max_model_len;
  size_t i = 0;
  while (i < running_.size() && budget > 0) {
    const int32_t h = running_[i];
    const V1Request& q = requests_[size_t(h)];
    const int32_t cached = q.cached;
    int32_t n = q.num_tokens() - cached;
    if (0 < threshold && threshold < n) n = threshold;
    if (n > budget) n = budget;
    if (max_len >= 0 && n > max_len - cached - 1) n = max_len - cached - 1;
    if (n <= 0) {
      ++i;
      continue;
    }
    const RequestBlocks& blocks = pool_.get(h);
    if (int64_t{cached} + n <= int64_t(blocks.table.size()) * bs) {
      // allocate_slots without a block to allocate (most decodes): it only caches the
      // blocks this step fills.
      if (pool_.enable_prefix_caching() && (cached + n) / bs > blocks.num_cached_blocks)
        pool_.cache_blocks(h, cached + n);
      take(h, n, budget);
      ++i;
      continue;
    }
    bool allocated = true;
    while (!pool_.allocate_slots(h, cached, n, nullptr, 0, 0, 0, max_len)) {
      int32_t victim;
      if (cfg_.priority) {
        // max(running, key=_priority_key): the largest (priority, arrival_time), ties to
        // the earliest in running order
        size_t at = 0;
        for (size_t j = 1; j < running_.size(); ++j)
          if (priority_after(running_[j], running_[at])) at = j;
        victim = running_[at];
        running_.erase(running_.begin() + std::ptrdiff_t(at));
        if (at < i) --i;
        // a victim already scheduled this step gives its tokens back
        for (size_t j = 0; j < scheduled_.size(); ++j) {
          if (scheduled_[j] != victim) continue;
          budget += num_new_tokens_[j];
          scheduled_.erase(scheduled_.begin() + std::ptrdiff_t(j));
          num_new_tokens_.erase(num_new_tokens_.begin() + std::ptrdiff_t(j));
          break;
        }
      } else {
        victim = running_.back();
        running_.pop_back();
      }
      preempt(victim);
      preempted_.push_back(requests_[size_t(victim)].seq_id);
      if (victim == h) {
        allocated = false;
        break;
      }
    }
    if (!allocated) {
      if (cfg_.priority) continue;  // it left the running list: i points at the next one
      break;
    }
    take(h, n, budget);
    ++i;
  }
  return budget;
}

// V1Scheduler._schedule_waiting: admit in queue order until one does not fit.
inline void V1Scheduler::schedule_waiting(int32_t threshold, int32_t budget) {
  const int32_t bs = pool_.block_size();
  const int32_t max_len = cfg_.max_model_len;
  const bool chunked = cfg_.enable_chunked_prefill;
  while (budget > 0 && int64_t(running_.size()) < cfg_.max_num_seqs) {
    if (waiting_.empty()) break;
    const int32_t h = waiting_.front();
    V1Request& q = requests_[size_t(h)];
    // A preempted sequence has grown: it may no longer fit anywhere.
    std::string reason;
    bool never = never_runs(q, reason);
    int32_t num_hit_tokens = 0;
    int32_t n = 0;
    if (!never) {
      pool_.find_cached_prefix(h, hits_);
      num_hit_tokens = int32_t(hits_.size()) * bs;
      n = q.num_tokens() - num_hit_tokens;
      if (!chunked && n > cfg_.max_num_batched_tokens) {
        reason = std::to_string(n) + " tokens to compute exceed max_num_batched_tokens " +
                 std::to_string(cfg_.max_num_batched_tokens) + " (no chunked prefill)";
        never = true;
      }
    }
    if (never) {
      waiting_.pop_front();
      reject(h, std::move(reason));
      continue;
    }
    if (0 < threshold && threshold < n) n = threshold;
    if (!chunked && n > budget) break;
    if (n > budget) n = budget;
    const int32_t full = max_len < 0 ? q.num_tokens() : std::min(q.num_tokens(), max_len);
    const int32_t watermark = running_.empty() ? 0 : watermark_blocks_;
    if (!pool_.allocate_slots(h, q.cached, n, hits_.data(), int32_t(hits_.size()), full,
                              watermark, max_len))
      break;
    waiting_.pop_front();
    running_.push_back(h);
    q.status = kSeqRunning;
    q.cached = num_hit_tokens;
    q.prefix_hit_tokens = num_hit_tokens;
    num_cached_tokens_ += num_hit_tokens;
    take(h, n, budget);
    admitted_.push_back(h);
    record(q.num_preemptions ? kResume : kAdmit, q, n);
  }
}

}  // namespace kvsim
