// vLLM 0.33's v1 scheduler for placeholder-token runs: the compiled V1Scheduler.
//
// A mirror of engine/v1/scheduler.py's V1Scheduler (and what it inherits from
// engine/core/scheduler.py's Scheduler) over a kvsim::BlockPool, for runs in which every
// sampled token is one fixed id and requests stop at max_tokens or max_model_len (ignore_eos;
// a request may also stop on the token, as one whose stop ids hold it). The Python classes are
// the specification: each rule below names the function it mirrors, and
// tests/engine/test_compiled_v1.py drives both with the same workloads and requires the same
// decisions, block ids, events and counters. Scheduler-level events (ARRIVE, ADMIT, RESUME,
// PREEMPT, FINISH, ABORT, REJECT, STEP) go into the pool's EventBuffer between its block
// events, in the Python path's order, stamped with the time the caller last set.
//
// Per step the scheduler also computes what the simulator prices and accounts a step by
// (StepInfo: kvsim/sim/executor.py's ``_counts`` for a plain V1Scheduler step, the step's
// prefill tokens, its kind), so that nothing per sequence has to cross into Python.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "block_pool.hpp"
#include "event_buffer.hpp"
#include "offload_connector.hpp"
#include "scheduler_base.hpp"
#include "v1_requests.hpp"

namespace kvsim {

class V1Scheduler : public SchedulerBase<V1Scheduler, BlockPool, V1Request> {
  friend class SchedulerBase<V1Scheduler, BlockPool, V1Request>;

 public:
  // V1Scheduler.__init__ over a fresh pool; ``token``: the id every step samples.
  V1Scheduler(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching,
              const V1Config& config, int64_t token)
      : SchedulerBase(num_blocks, block_size, enable_prefix_caching),
        cfg_(config),
        token_(token),
        waiting_(&requests_, config.priority) {
    if (config.max_num_seqs < 1 || config.max_num_batched_tokens < 1)
      throw std::invalid_argument("max_num_seqs and max_num_batched_tokens must be positive");
    if (config.max_model_len == 0 || config.max_model_len < -1)
      throw std::invalid_argument("max_model_len must be positive");
    if (config.long_prefill_token_threshold < 0)
      throw std::invalid_argument("long_prefill_token_threshold must be >= 0");
    if (!(config.watermark >= 0.0 && config.watermark < 1.0))
      throw std::invalid_argument("watermark must be in [0, 1)");
    // V1Scheduler.__init__: vLLM keeps int(watermark * num_gpu_blocks) free, its pool
    // counting the null block.
    watermark_blocks_ = static_cast<int32_t>(config.watermark * double(num_blocks + 1));
  }

  // --- requests (V1Scheduler.add_request) -------------------------------------------------
  // Each returns false when the request can never run: it is then finished as REJECTED now
  // and reported by the next update(). ``stops_on_token``: the placeholder token is one of
  // its stop ids (SamplingParams.stop_ids).

  bool add_token_request(int64_t seq_id, const int64_t* tokens, int32_t n, int64_t max_tokens,
                         double arrival_time, int64_t priority, bool stops_on_token = false) {
    check_new(seq_id, n, max_tokens);
    return add(pool_.add_token_request(seq_id, tokens, n), seq_id, n, max_tokens, arrival_time,
               priority, stops_on_token);
  }
  bool add_hash_id_request(int64_t seq_id, int32_t num_prompt_tokens, const int64_t* ids,
                           int32_t num_ids, int32_t hash_block_size, int64_t max_tokens,
                           double arrival_time, int64_t priority, bool stops_on_token = false) {
    check_new(seq_id, num_prompt_tokens, max_tokens);
    const int32_t h =
        pool_.add_hash_id_request(seq_id, num_prompt_tokens, ids, num_ids, hash_block_size);
    return add(h, seq_id, num_prompt_tokens, max_tokens, arrival_time, priority, stops_on_token);
  }
  bool add_unique_request(int64_t seq_id, int32_t num_prompt_tokens, int64_t max_tokens,
                          double arrival_time, int64_t priority, bool stops_on_token = false) {
    check_new(seq_id, num_prompt_tokens, max_tokens);
    return add(pool_.add_unique_request(seq_id, num_prompt_tokens), seq_id, num_prompt_tokens,
               max_tokens, arrival_time, priority, stops_on_token);
  }

  // --- schedule (V1Scheduler.schedule) -----------------------------------------------------

  const StepInfo& schedule() {
    begin_schedule();
    // vLLM lets a lone sequence use the whole budget (nobody to starve).
    const size_t eligible = running_.size() + waiting_.size() + holding_.size();
    const int32_t threshold = eligible > 1 ? cfg_.long_prefill_token_threshold : 0;
    admitted_.clear();
    const int32_t budget = schedule_running(threshold);
    if (preempted_.empty()) {
      if (connector_) {
        schedule_waiting_offload(threshold, budget);
      } else {
        schedule_waiting(threshold, budget);
      }
    }
    // rejected = the rejections on arrival reported now, then the waiting pass's
    rejected_.clear();
    for (const FinishedRecord& f : finished_early_) rejected_.push_back(f.seq_id);
    pending_ = true;
    count_step();
    if (connector_) after_schedule_offload();
    record_step(info_.num_batched_tokens);
    return info_;
  }

  // --- update (V1Scheduler.update) ---------------------------------------------------------

  // Apply the pending step: each scheduled request advances by its tokens; one whose prompt
  // (or recompute) is complete samples the token and may finish. Returns the requests
  // finished, those rejected since the last update first (Scheduler._take_pending).
  const std::vector<FinishedRecord>& update() {
    begin_update();
    for (size_t k = 0; k < scheduled_.size(); ++k) {
      const int32_t h = scheduled_[k];
      V1Request& q = requests_[size_t(h)];
      if (q.status != kSeqRunning) continue;  // aborted after it was scheduled
      q.cached += num_new_tokens_[k];
      num_cached_tokens_ += num_new_tokens_[k];
      if (q.cached < q.num_tokens()) continue;  // a prefill chunk: nothing sampled yet
      ++q.num_generated;
      pool_.append_tokens(h, &token_, 1);
      if (q.num_generated == 1) record(kFirstToken, q, q.num_tokens());
      if (q.stops_on_token || q.cached >= q.finish_cached_count) done_.push_back(h);
    }
    finish_done();
    return finished_;
  }

  // OffloadingV1Scheduler.update: the step's update, then the transfers (job ids) reported
  // done by this step (``done_jobs()`` gives them back, in the order given).
  const std::vector<FinishedRecord>& update(const std::vector<int64_t>& completed_jobs) {
    update();
    if (connector_) {
      connector_->recycle(done_jobs_);  // (their columns' room for the next jobs)
    } else {
      done_jobs_.clear();
    }
    if (connector_ && !completed_jobs.empty()) complete_jobs(completed_jobs);
    return finished_;
  }

  // --- a KV offload tier (OffloadingV1Scheduler with an OffloadConfig) ----------------------

  // Put a CPU tier behind the prefix cache (before any request is added): ``num_chunks``
  // chunks of ``blocks_per_chunk`` blocks, evicting by ARC (``arc``) or LRU.
  void enable_offload(int64_t num_chunks, int32_t blocks_per_chunk, bool arc, bool prompt_only) {
    if (step_ || !unfinished_.empty()) throw std::logic_error("enable offload on a fresh scheduler");
    if (cfg_.priority)
      throw std::invalid_argument("the offloading scheduler takes FCFS only (as the Python one)");
    connector_ = std::make_unique<OffloadConnector>(num_chunks, blocks_per_chunk, arc, prompt_only,
                                                    pool_.block_size(), pool_.enable_prefix_caching());
  }
  OffloadConnector* connector() { return connector_.get(); }
  // The step's connector output (valid until the next schedule()).
  const OffloadMeta& offload_meta() const { return connector_->meta(); }
  // The jobs the last update() took as completed, in the order given.
  const std::vector<OffloadJob>& done_jobs() const { return done_jobs_; }
  int32_t num_holding() const { return int32_t(holding_.size()); }

  // --- queries -----------------------------------------------------------------------------

  // V1Scheduler.has_unfinished
  bool has_unfinished() const {
    if (connector_ && (!holding_.empty() || connector_->has_pending_work())) return true;
    return !waiting_.empty() || !running_.empty() || !finished_early_.empty();
  }
  int32_t num_waiting() const { return int32_t(waiting_.size() + holding_.size()); }
  int32_t watermark_blocks() const { return watermark_blocks_; }
  const V1Config& config() const { return cfg_; }

  // The pending (or last) step's tokens per scheduled request and admissions (tests).
  const std::vector<int32_t>& num_new_tokens() const { return num_new_tokens_; }
  const std::vector<int32_t>& admitted() const { return admitted_; }
  std::vector<int32_t> waiting() const { return waiting_.to_vector(); }

 private:
  // V1Scheduler.add_request of the request the pool knows as ``h``.
  bool add(int32_t h, int64_t seq_id, int32_t num_prompt_tokens, int64_t max_tokens,
           double arrival_time, int64_t priority, bool stops_on_token) {
    if (size_t(h) >= requests_.size()) requests_.resize(size_t(h) + 1);
    V1Request& q = requests_[size_t(h)];
    q = V1Request();
    q.seq_id = seq_id;
    q.num_prompt_tokens = num_prompt_tokens;
    // Sequence.__init__: max_tokens generated is reached when cached hits this count;
    // add_request lowers it for max_model_len.
    int64_t finish = int64_t{num_prompt_tokens} + max_tokens - 1;
    if (cfg_.max_model_len >= 0) finish = std::min<int64_t>(finish, cfg_.max_model_len - 1);
    q.finish_cached_count = int32_t(std::min<int64_t>(finish, std::numeric_limits<int32_t>::max()));
    q.stops_on_token = stops_on_token;
    q.priority = priority;
    q.arrival_time = arrival_time;
    if (cfg_.priority) q.id_text = std::to_string(seq_id);
    unfinished_.emplace(seq_id, h);
    record(kArrive, q, q.num_tokens());
    std::string reason;
    if (never_runs(q, reason)) {
      reject(h, std::move(reason));
      return false;
    }
    waiting_.push_back(h);
    if (connector_) connector_->on_new_request(seq_id, num_prompt_tokens);
    return true;
  }

  // V1Scheduler._never_runs: why ``q`` can never run (its reason), or false.
  bool never_runs(const V1Request& q, std::string& reason) const {
    int32_t num_tokens = q.num_tokens();
    const int32_t max_len = cfg_.max_model_len;
    if (max_len >= 0) {
      if (q.num_prompt_tokens >= max_len) {
        reason = "prompt of " + std::to_string(q.num_prompt_tokens) +
                 " tokens leaves no room for an output token within max_model_len " +
                 std::to_string(max_len);
        return true;
      }
      num_tokens = std::min(num_tokens, max_len);
    }
    const int64_t needed = blocks_needed(num_tokens);
    if (needed > pool_.num_blocks()) {
      reason = "exceeds KV capacity: " + std::to_string(num_tokens) + " tokens need " +
               std::to_string(needed) + " blocks, the pool has " +
               std::to_string(pool_.num_blocks());
      return true;
    }
    return false;
  }

  // V1Scheduler._schedule_running (returns the token budget left) and _schedule_waiting:
  // defined in v1_passes.hpp
  int32_t schedule_running(int32_t threshold);
  void schedule_waiting(int32_t threshold, int32_t budget);
  // OffloadingV1Scheduler's waiting pass and what it adds around the step: defined in
  // v1_offload_passes.hpp
  void schedule_waiting_offload(int32_t threshold, int32_t budget);
  void finish_load(int32_t h);
  void after_schedule_offload();
  void complete_jobs(const std::vector<int64_t>& completed_jobs);
  int32_t full_tokens(const V1Request& q) const {
    return cfg_.max_model_len < 0 ? q.num_tokens() : std::min(q.num_tokens(), cfg_.max_model_len);
  }

  // (priority, arrival_time) of ``a`` > that of ``b`` (_priority_key's tuple order)
  bool priority_after(int32_t a, int32_t b) const {
    const V1Request& x = requests_[size_t(a)];
    const V1Request& y = requests_[size_t(b)];
    if (x.priority != y.priority) return x.priority > y.priority;
    return x.arrival_time > y.arrival_time;
  }

  // seqs.append(seq); num_new_tokens.append(n); budget -= n
  void take(int32_t h, int32_t n, int32_t& budget) {
    scheduled_.push_back(h);
    num_new_tokens_.push_back(n);
    budget -= n;
  }

  // Scheduler.abort of a request not running: off the waiting queue, or
  // (OffloadingV1Scheduler.abort) off the holding queue when it waits for its load.
  void leave_waiting(int32_t h) {
    const auto held = std::find(holding_.begin(), holding_.end(), h);
    if (connector_ && held != holding_.end()) {
      holding_.erase(held);
    } else {
      waiting_.remove(h);
    }
  }

  // V1Scheduler._preempt (recompute): blocks freed, to the front of the waiting queue.
  void preempt(int32_t h) {
    if (connector_) inflight_prefills_.erase(h);
    V1Request& q = requests_[size_t(h)];
    num_cached_tokens_ -= q.cached;
    pool_.free(h, true);
    q.cached = 0;
    q.status = kSeqWaiting;
    ++q.num_preemptions;
    waiting_.push_front(h);
    // num_tokens: what its lookup will cover when it is admitted again
    record(kPreempt, q, q.num_tokens());
  }

  // V1Scheduler._finish: the caller has taken it off the queues.
  void finish(int32_t h, SeqStatus status, EventKind kind, std::string reason) {
    V1Request& q = requests_[size_t(h)];
    if (connector_ && status != kSeqRejected) {
      // OffloadingV1Scheduler._finish: the connector hears of it before its blocks are freed
      inflight_prefills_.erase(h);
      connector_->request_finished(pool_, h, q.seq_id, q.num_tokens());
    }
    q.status = status;
    unfinished_.erase(q.seq_id);
    num_cached_tokens_ -= q.cached;
    record(kind, q, q.num_tokens());
    pool_.free(h, false);
    report_finished(h, q, status, std::move(reason));
  }

  // A handle no pending step names any more: the pool forgets its request.
  void release(int32_t h) { pool_.remove_request(h); }

  // Scheduler._reject: finished as REJECTED, reported by the next update().
  void reject(int32_t h, std::string reason) {
    finish(h, kSeqRejected, kReject, std::move(reason));
  }

  // Scheduler.schedule's step kind and the executor's counts of the step just scheduled.
  void count_step() {
    StepInfo& s = info_;
    s = StepInfo();
    s.step = step_;
    s.num_seqs = int64_t(scheduled_.size());
    int64_t num_last_token = 0;  // step_kind's decodes: computing only their last token
    for (size_t k = 0; k < scheduled_.size(); ++k) {
      const V1Request& q = requests_[size_t(scheduled_[k])];
      const int64_t n = num_new_tokens_[k];
      const int64_t c = q.cached;
      s.num_batched_tokens += n;
      // scheduler_output.step_kind / simulation.prefill_tokens
      if (n == 1 && c + 1 == q.num_tokens()) {
        ++num_last_token;
      } else {
        s.prefill_tokens += n;
      }
      // executor._counts: one token over a non-empty cache is priced as a decode
      if (n == 1 && c) {
        ++s.num_decode_seqs;
        s.decode_context_tokens += c + 1;
      } else {
        s.prefill_causal_pairs += n * (n + 1) / 2;
        s.prefill_cached_pairs += n * c;
        s.prefill_cached_tokens += c;
      }
    }
    if (num_last_token == s.num_seqs) {
      s.kind = kDecodeStep;
    } else {
      s.kind = num_last_token == 0 ? kPrefillStep : kMixedStep;
    }
    s.blocks_walked = pool_.num_blocks() - pool_.num_free_blocks();
    s.num_preempted = int32_t(preempted_.size());
    s.num_rejected = int32_t(rejected_.size());
  }

  int64_t blocks_needed(int32_t num_tokens) const {
    return (int64_t{num_tokens} + pool_.block_size() - 1) / pool_.block_size();
  }

  V1Config cfg_;
  int64_t token_;
  int32_t watermark_blocks_ = 0;
  WaitingQueue waiting_;  // over requests_ (by the pool's request handle)
  std::vector<int32_t> admitted_, hits_;  // the step's admissions, prefix hits
  // with a KV offload tier (OffloadingV1Scheduler)
  std::unique_ptr<OffloadConnector> connector_;
  std::deque<int32_t> holding_;  // _kv_holding: loading, or loaded and not yet running
  std::unordered_set<int64_t> loaded_;  // seq ids whose load is reported done
  std::unordered_set<int32_t> inflight_prefills_;  // handles admitted and still prefilling
  std::vector<OffloadJob> done_jobs_;
  std::vector<OffloadConnector::Scheduled> batch_;
  std::vector<int64_t> admitted_ids_;
  std::vector<int32_t> skipped_holding_, skipped_waiting_;
};

}  // namespace kvsim

#include "v1_passes.hpp"  // the two scheduling passes, defined out of line
#include "v1_offload_passes.hpp"  // the offloading scheduler's rules, defined out of line
