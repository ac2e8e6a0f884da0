// The compiled v1 scheduler's KV-connector rules: OffloadingV1Scheduler of
// engine/v1/offloading_scheduler.py (vLLM's scheduler with its OffloadingConnector) over
// OffloadConnector (offload_connector.hpp). Included at the end of v1_scheduler.hpp, never on
// its own; each function names the Python one it mirrors.
#pragma once

#include "v1_scheduler.hpp"

namespace kvsim {

// OffloadingV1Scheduler._schedule_waiting: holding requests (loading, or loaded) go first;
// one the connector cannot answer yet, or still loading, is skipped for this step; one with
// chunks to load gets its blocks now (if the blocks in-flight prefills still need stay
// free) and waits for its load in the holding queue.
inline void V1Scheduler::schedule_waiting_offload(int32_t threshold, int32_t budget) {
  OffloadConnector& connector = *connector_;
  const int32_t bs = pool_.block_size();
  const bool chunked = cfg_.enable_chunked_prefill;
  skipped_holding_.clear();
  skipped_waiting_.clear();
  while (budget > 0 && int64_t(running_.size()) < cfg_.max_num_seqs) {
    const bool from_holding = !holding_.empty();
    if (!from_holding && waiting_.empty()) break;
    const int32_t h = from_holding ? holding_.front() : waiting_.front();
    auto pop = [&]() {
      if (from_holding) {
        holding_.pop_front();
      } else {
        waiting_.pop_front();
      }
    };
    V1Request& q = requests_[size_t(h)];
    if (q.status == kSeqWaitingForKv) {
      if (!loaded_.count(q.seq_id)) {
        pop();
        skipped_holding_.push_back(h);
        continue;
      }
      loaded_.erase(q.seq_id);
      finish_load(h);
    }
    hits_.clear();
    int32_t num_local = 0, num_external = 0;
    const bool looked_up = q.cached == 0;
    if (looked_up) {
      std::string reason;
      if (never_runs(q, reason)) {
        pop();
        reject(h, std::move(reason));
        continue;
      }
      pool_.find_cached_prefix(h, hits_);
      num_local = int32_t(hits_.size()) * bs;
      const int32_t matched =
          connector.get_num_new_matched_tokens(pool_, h, q.seq_id, q.num_tokens(), num_local);
      if (matched < 0) {  // its chunks are not ready yet: ask again next step
        pop();
        skipped_waiting_.push_back(h);
        continue;
      }
      num_external = matched;
    }
    const int32_t num_computed = q.cached + num_local + num_external;
    const bool loading = num_external > 0;
    int32_t n = 0, reserved = 0;
    if (loading) {
      for (const int32_t p : inflight_prefills_) {
        const int64_t need = blocks_needed(full_tokens(requests_[size_t(p)]));
        reserved += int32_t(std::max<int64_t>(need - int64_t(pool_.get(p).table.size()), 0));
      }
    } else {
      n = q.num_tokens() - num_computed;
      if (0 < threshold && threshold < n) n = threshold;
      if (!chunked && n > budget) break;
      n = std::min(n, budget);
    }
    const int32_t watermark = running_.empty() ? 0 : watermark_blocks_;
    if (!pool_.allocate_slots(h, q.cached, n, hits_.data(), int32_t(hits_.size()), full_tokens(q),
                              watermark, cfg_.max_model_len, num_external, reserved, !loading))
      break;
    connector.update_state_after_alloc(q.seq_id, pool_.get(h).table, num_external);
    pop();
    if (looked_up) {
      q.prefix_hit_tokens = num_local;
      q.offload_hit_tokens = num_external;
      num_cached_tokens_ += num_local + num_external;
      q.cached = num_computed;
    }
    if (loading) {
      q.status = kSeqWaitingForKv;
      inflight_prefills_.insert(h);
      skipped_holding_.push_back(h);
      if (pool_.record_events) {
        const std::vector<int32_t>& table = pool_.get(h).table;
        const size_t first = size_t(num_local / bs);
        pool_.events.record(kOffloadLoad, q.seq_id, pool_.num_free_blocks(), table.data() + first,
                            table.size() - first, num_external);
      }
      continue;
    }
    running_.push_back(h);
    q.status = kSeqRunning;
    if (num_computed + n < q.num_tokens()) inflight_prefills_.insert(h);
    take(h, n, budget);
    admitted_.push_back(h);
    record(q.num_preemptions ? kResume : kAdmit, q, n);
  }
  // The skipped go back to the front of their queues, in their order.
  for (auto it = skipped_holding_.rbegin(); it != skipped_holding_.rend(); ++it)
    holding_.push_front(*it);
  for (auto it = skipped_waiting_.rbegin(); it != skipped_waiting_.rend(); ++it)
    waiting_.push_front(*it);
}

// OffloadingV1Scheduler._finish_load: cache the loaded blocks; a load covering the whole
// request leaves its last token to compute.
inline void V1Scheduler::finish_load(int32_t h) {
  V1Request& q = requests_[size_t(h)];
  if (pool_.enable_prefix_caching()) pool_.cache_blocks(h, q.cached);
  if (q.cached == q.num_tokens()) {
    --q.cached;
    --num_cached_tokens_;
  }
  q.status = kSeqWaiting;
}

// OffloadingV1Scheduler._after_schedule: prefills that complete this step leave the
// in-flight set; the connector builds the step's loads, stores and flushes (OFFLOAD_STORE
// rows for the stores).
inline void V1Scheduler::after_schedule_offload() {
  batch_.clear();
  for (size_t k = 0; k < scheduled_.size(); ++k) {
    const int32_t h = scheduled_[k];
    const V1Request& q = requests_[size_t(h)];
    if (q.cached + num_new_tokens_[k] >= q.num_tokens()) inflight_prefills_.erase(h);
    batch_.push_back({h, q.seq_id, q.cached, q.num_tokens(), num_new_tokens_[k]});
  }
  admitted_ids_.clear();
  for (const int32_t h : admitted_) admitted_ids_.push_back(requests_[size_t(h)].seq_id);
  const OffloadMeta& meta = connector_->build_meta(pool_, batch_, admitted_ids_, preempted_);
  if (!pool_.record_events) return;
  const int32_t free = pool_.num_free_blocks();
  const int32_t bs = pool_.block_size();
  for (const int64_t j : meta.store_jobs) {
    const std::vector<int32_t>& blocks = connector_->job(j).gpu_block_ids;
    pool_.events.record(kOffloadStore, connector_->job(j).seq_id, free, blocks.data(),
                        blocks.size(), int32_t(blocks.size()) * bs);
  }
}

// OffloadingV1Scheduler._complete_jobs: stores become readable, loads unpin their chunks and
// let their request run; an OFFLOAD_*_DONE row each.
inline void V1Scheduler::complete_jobs(const std::vector<int64_t>& completed_jobs) {
  connector_->update_connector_output(completed_jobs, done_jobs_);
  const int32_t bs = pool_.block_size();
  for (const OffloadJob& job : done_jobs_) {
    if (!job.is_store) loaded_.insert(job.seq_id);
    if (pool_.record_events) {
      pool_.events.record(job.is_store ? kOffloadStoreDone : kOffloadLoadDone, job.seq_id,
                          pool_.num_free_blocks(), job.gpu_block_ids.data(),
                          job.gpu_block_ids.size(), int32_t(job.gpu_block_ids.size()) * bs);
    }
  }
}

}  // namespace kvsim
