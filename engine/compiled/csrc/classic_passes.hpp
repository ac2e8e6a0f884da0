// The compiled classic scheduler's passes per step (Scheduler._schedule_prefill,
// _never_fits, _schedule_decode and _make_room of engine/core/scheduler.py), defined out of
// line so that classic_scheduler.hpp reads as the class: included at its end, never on its
// own.
#pragma once

#include <string>

#include "classic_scheduler.hpp"

namespace kvsim {

// Scheduler._schedule_prefill: admit from the head while seats, the token budget and the
// free blocks allow; a head that can never fit is rejected. scheduled_ stays empty when
// nothing is admitted.
inline void ClassicScheduler::schedule_prefill() {
  const int64_t seat_limit = int64_t{cfg_.max_num_seqs} - int64_t(running_.size());
  while (!waiting_.empty()) {
    const int32_t h = waiting_.front();
    ClassicRequest& q = requests_[size_t(h)];
    const int32_t n = q.num_tokens();  // waiting sequences hold no cache
    if (h != head_fits_) {
      std::string reason;
      if (never_fits(q, n, reason)) {
        waiting_.pop_front();
        rejected_.push_back(q.seq_id);
        reject(h, std::move(reason));
        continue;
      }
      head_fits_ = h;
    }
    if (int64_t(scheduled_.size()) >= seat_limit ||
        num_batched_tokens_ + n > cfg_.max_num_batched_tokens)
      break;
    if (!pool_.can_allocate(n)) break;
    waiting_.pop_front();
    head_fits_ = -1;  // if it comes back (preempted), it has grown: check again
    pool_.allocate(q.seq_id, n, q.table);
    q.status = kSeqRunning;
    scheduled_.push_back(h);
    num_new_tokens_.push_back(n);
    num_batched_tokens_ += n;
    record(q.num_preemptions ? kResume : kAdmit, q, n);
  }
  running_.insert(running_.end(), scheduled_.begin(), scheduled_.end());
}

// Scheduler._never_fits: why ``q`` (``n`` tokens to prefill) can never be admitted.
inline bool ClassicScheduler::never_fits(const ClassicRequest& q, int32_t n,
                                         std::string& reason) const {
  const int32_t max_len = cfg_.max_model_len;
  if (max_len >= 0 && q.num_prompt_tokens > max_len) {
    reason = "prompt of " + std::to_string(q.num_prompt_tokens) +
             " tokens exceeds max_model_len " + std::to_string(max_len);
    return true;
  }
  if (n > cfg_.max_num_batched_tokens) {
    reason = std::to_string(n) + " tokens exceed max_num_batched_tokens " +
             std::to_string(cfg_.max_num_batched_tokens) + " (no chunked prefill)";
    return true;
  }
  if (!pool_.can_ever_allocate(n)) {
    reason = "exceeds KV capacity: " + std::to_string(n) + " tokens need " +
             std::to_string(pool_.blocks_needed(n)) + " blocks, the pool has " +
             std::to_string(pool_.num_blocks()) + " (watermark " +
             std::to_string(pool_.watermark_blocks()) + ")";
    return true;
  }
  return false;
}

// Scheduler._schedule_decode: every running sequence's next token; one that starts a new
// block takes one, preempting from the most recently admitted when none is free. Victims
// leave the end of running_, so the loop stops earlier (it never reaches them).
inline void ClassicScheduler::schedule_decode() {
  const int32_t bs = pool_.block_size();
  for (size_t i = 0; i < running_.size(); ++i) {
    const int32_t h = running_[i];
    ClassicRequest& q = requests_[size_t(h)];
    if (q.cached % bs || int64_t{q.cached} < int64_t(q.table.size()) * bs) continue;
    if (pool_.num_free_blocks() == 0 && !make_room(h)) break;
    pool_.append_block(q.seq_id, q.table);
  }
  scheduled_.assign(running_.begin(), running_.end());
  num_batched_tokens_ = int64_t(running_.size());
}

// Scheduler._make_room: preempt from the most recently admitted until a block is free for
// ``h``; false when ``h`` itself had to go (preempted, or rejected when it runs alone and
// still cannot grow).
inline bool ClassicScheduler::make_room(int32_t h) {
  while (pool_.num_free_blocks() == 0) {
    const int32_t victim = running_.back();
    running_.pop_back();
    if (victim == h && running_.empty()) {
      const ClassicRequest& q = requests_[size_t(h)];
      rejected_.push_back(q.seq_id);
      reject(h, "exceeds KV capacity: " + std::to_string(q.num_tokens()) +
                    " tokens do not fit in " + std::to_string(pool_.num_blocks()) +
                    " blocks of " + std::to_string(pool_.block_size()));
      return false;
    }
    preempt(victim);
    preempted_.push_back(requests_[size_t(victim)].seq_id);
    if (victim == h) return false;
  }
  return true;
}

}  // namespace kvsim
