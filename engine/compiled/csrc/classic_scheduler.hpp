// vLLM's classic (2023) scheduler for placeholder-token runs: the compiled Scheduler.
//
// A mirror of engine/core/scheduler.py's Scheduler (FCFS, a step is a prefill batch or a
// decode batch, recompute preemption of the most recently admitted) over a ClassicPool
// (csrc/classic_pool.hpp), for runs in which every sampled token is a placeholder and
// requests stop at max_tokens or max_model_len (cost mode's FastDecodeScheduler, whose
// decisions and events are the plain Scheduler's). The Python class is the specification:
// each rule here and in classic_passes.hpp names the function it mirrors, and
// tests/engine/test_compiled_classic.py drives both with the same workloads and requires the
// same decisions, block ids, events and counters. Scheduler events (ARRIVE, ADMIT, RESUME, PREEMPT, FINISH, ABORT, REJECT, STEP) go
// into the pool's EventBuffer between its block events, in the Python path's order, stamped
// with the time the caller last set.
//
// Per step it computes what the simulator prices and accounts a step by (StepInfo, as for
// the v1 core: kvsim/sim/executor.py's ``_counts`` with the classic blocks walked), so that
// SimLoopOf<ClassicScheduler> (csrc/sim_loop.hpp) runs it as it runs the v1 scheduler.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "classic_pool.hpp"
#include "event_buffer.hpp"
#include "v1_requests.hpp"  // SeqStatus, StepInfo, FinishedRecord

namespace kvsim {

// engine/core/scheduler_output.py's SchedulerConfig as the classic scheduler reads it.
// max_model_len < 0: none.
struct ClassicConfig {
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 8192;
  int32_t max_model_len = -1;
};

// What a Sequence holds for a placeholder-token run under the classic scheduler.
struct ClassicRequest {
  int64_t seq_id = 0;
  int32_t num_prompt_tokens = 0;
  int32_t num_generated = 0;            // len(Sequence.generated_token_ids)
  int32_t cached = 0;                   // Sequence.cached_token_count
  int64_t finish_cached_count = 0;      // Sequence._finish_cached_count
  SeqStatus status = kSeqWaiting;
  int32_t num_preemptions = 0;
  std::vector<int32_t> table;  // Sequence.block_table

  int32_t num_tokens() const { return num_prompt_tokens + num_generated; }
};

class ClassicScheduler {
 public:
  ClassicScheduler(int32_t num_blocks, int32_t block_size, double watermark,
                   const ClassicConfig& config)
      : pool_(num_blocks, block_size, watermark), cfg_(config) {
    if (config.max_num_seqs < 1 || config.max_num_batched_tokens < 1)
      throw std::invalid_argument("max_num_seqs and max_num_batched_tokens must be positive");
    if (config.max_model_len == 0 || config.max_model_len < -1)
      throw std::invalid_argument("max_model_len must be positive");
  }

  // --- requests ---------------------------------------------------------------------------

  // Scheduler.add_request of a new sequence of ``num_prompt_tokens`` tokens generating at
  // most ``max_tokens`` (ignore_eos): queued behind every waiting one; ARRIVE.
  void add_request(int64_t seq_id, int32_t num_prompt_tokens, int64_t max_tokens) {
    if (unfinished_.count(seq_id))
      throw std::invalid_argument("sequence " + std::to_string(seq_id) +
                                  " is already queued or running");
    if (num_prompt_tokens < 1) throw std::invalid_argument("prompt_token_ids must not be empty");
    if (max_tokens < 1) throw std::invalid_argument("max_tokens must be a positive integer");
    int32_t h;
    if (!free_handles_.empty()) {
      h = free_handles_.back();
      free_handles_.pop_back();
    } else {
      h = int32_t(requests_.size());
      requests_.emplace_back();
    }
    ClassicRequest& q = requests_[size_t(h)];
    q = ClassicRequest();
    q.seq_id = seq_id;
    q.num_prompt_tokens = num_prompt_tokens;
    // Sequence.__init__, lowered for max_model_len by Scheduler.add_request (a prompt of
    // exactly max_model_len still gets its one prefill token)
    q.finish_cached_count = int64_t{num_prompt_tokens} + max_tokens - 1;
    if (cfg_.max_model_len >= 0)
      q.finish_cached_count = std::min<int64_t>(
          q.finish_cached_count, std::max<int64_t>(cfg_.max_model_len - 1, num_prompt_tokens));
    waiting_.push_back(h);
    unfinished_.emplace(seq_id, h);
    record(kArrive, q, q.num_tokens());
  }

  // Scheduler.abort: finished as ABORTED and its blocks freed now; false if ``seq_id`` is
  // unknown or finished. One aborted between schedule() and update() is skipped by that
  // update().
  bool abort(int64_t seq_id) {
    const auto found = unfinished_.find(seq_id);
    if (found == unfinished_.end()) return false;
    const int32_t h = found->second;
    if (requests_[size_t(h)].status == kSeqRunning) {
      running_.erase(std::find(running_.begin(), running_.end(), h));
    } else {
      waiting_.erase(std::find(waiting_.begin(), waiting_.end(), h));
      if (head_fits_ == h) head_fits_ = -1;  // Python compares identity: never again
    }
    finish(h, kSeqAborted, kAbort, "aborted");
    return true;
  }

  // The clock the events that follow are stamped with (EventRecorder's clock()).
  void set_time(double time_s) {
    time_ = time_s;
    pool_.events.begin_step(step_, time_);
  }

  // --- schedule (Scheduler.schedule) -------------------------------------------------------

  const StepInfo& schedule() {
    if (pending_) throw std::logic_error("a step was scheduled but never updated");
    ++step_;
    pool_.events.begin_step(step_, time_);
    scheduled_.clear();
    preempted_.clear();
    rejected_.clear();
    num_new_tokens_.clear();
    num_batched_tokens_ = 0;
    if (!waiting_.empty() && !head_blocked()) schedule_prefill();
    // nothing admitted (rejections at most): a decode step, which carries them
    is_prefill_ = !scheduled_.empty();
    if (!is_prefill_) schedule_decode();
    pending_ = true;
    count_step();
    if (pool_.record_events && !scheduled_.empty()) {
      // Scheduler.schedule's sink.record_step (EventRecorder keeps kind and num_seqs aside)
      pool_.events.record(kStep, kNoSeq, pool_.num_free_blocks(), nullptr, 0,
                          int32_t(num_batched_tokens_));
      step_kinds.push_back(info_.kind);
      step_num_seqs.push_back(info_.num_seqs);
    }
    return info_;
  }

  // --- update (Scheduler.update) -----------------------------------------------------------

  // Apply the pending step: every scheduled sequence still running advances by its tokens
  // and samples the placeholder; those at their length limit finish. Returns the requests
  // finished, those rejected while scheduling the step first (Scheduler._take_pending).
  const std::vector<FinishedRecord>& update() {
    if (!pending_) throw std::logic_error("update() without a scheduled step");
    pending_ = false;
    finished_.swap(finished_early_);
    finished_early_.clear();
    done_.clear();
    for (size_t k = 0; k < scheduled_.size(); ++k) {
      ClassicRequest& q = requests_[size_t(scheduled_[k])];
      if (q.status != kSeqRunning) continue;  // aborted after it was scheduled
      // _update_prefill: the whole sequence; _update_decode: one token
      const int32_t n = is_prefill_ ? num_new_tokens_[k] : 1;
      q.cached += n;
      num_cached_tokens_ += n;
      ++q.num_generated;
      if (q.cached >= q.finish_cached_count) done_.push_back(scheduled_[k]);
    }
    // Scheduler._finish_sampled, then _drop_finished (the running order kept)
    for (const int32_t h : done_) finish(h, kSeqLength, kFinish, "length");
    if (!done_.empty()) {
      running_.erase(std::remove_if(running_.begin(), running_.end(),
                                    [this](int32_t h) {
                                      return requests_[size_t(h)].status != kSeqRunning;
                                    }),
                     running_.end());
    }
    for (const int32_t h : released_) release(h);
    released_.clear();
    return finished_;
  }

  // --- queries -----------------------------------------------------------------------------

  // Scheduler.has_unfinished (a rejection is reported by the update of its own step)
  bool has_unfinished() const { return !waiting_.empty() || !running_.empty(); }
  int32_t num_running() const { return int32_t(running_.size()); }
  int32_t num_waiting() const { return int32_t(waiting_.size()); }
  int64_t num_cached_tokens() const { return num_cached_tokens_; }  // Scheduler's counter
  int32_t step() const { return step_; }
  bool pending() const { return pending_; }
  const StepInfo& last_step() const { return info_; }
  ClassicPool& pool() { return pool_; }

  // The pending (or last) step's decisions (tests): scheduled handles in batch order and
  // their tokens, preempted and rejected seq_ids.
  const std::vector<int32_t>& scheduled() const { return scheduled_; }
  std::vector<int32_t> num_new_tokens() const {
    if (is_prefill_) return num_new_tokens_;
    return std::vector<int32_t>(scheduled_.size(), 1);
  }
  const std::vector<int64_t>& preempted() const { return preempted_; }
  const std::vector<int64_t>& rejected() const { return rejected_; }
  const std::vector<int32_t>& running() const { return running_; }
  std::vector<int32_t> waiting() const { return {waiting_.begin(), waiting_.end()}; }
  const ClassicRequest& request(int32_t h) const { return requests_.at(size_t(h)); }
  // The handle of an unfinished request, -1 if none.
  int32_t handle_of(int64_t seq_id) const {
    const auto found = unfinished_.find(seq_id);
    return found == unfinished_.end() ? -1 : found->second;
  }

  // The STEP rows' step kind and batch size, one per STEP event in the pool's buffer.
  Column<int8_t> step_kinds;
  Column<int64_t> step_num_seqs;

 private:
  // Scheduler._head_blocked: the head already found able to fit still has no seat or blocks.
  bool head_blocked() const {
    const int32_t head = waiting_.front();
    if (head != head_fits_) return false;
    if (int64_t(running_.size()) >= cfg_.max_num_seqs) return true;
    return !pool_.can_allocate(requests_[size_t(head)].num_tokens());
  }

  // Scheduler._schedule_prefill, _never_fits, _schedule_decode and _make_room: defined in
  // classic_passes.hpp
  void schedule_prefill();
  bool never_fits(const ClassicRequest& q, int32_t n, std::string& reason) const;
  void schedule_decode();
  bool make_room(int32_t h);

  // Scheduler._preempt (recompute): blocks freed, to the front of the waiting queue.
  void preempt(int32_t h) {
    ClassicRequest& q = requests_[size_t(h)];
    num_cached_tokens_ -= q.cached;
    pool_.free(q.seq_id, q.table);
    q.cached = 0;
    q.status = kSeqWaiting;
    ++q.num_preemptions;
    waiting_.push_front(h);
    record(kPreempt, q, 0);
  }

  // Scheduler._finish: the caller has taken it off the queues.
  void finish(int32_t h, SeqStatus status, EventKind kind, std::string reason) {
    ClassicRequest& q = requests_[size_t(h)];
    q.status = status;
    unfinished_.erase(q.seq_id);
    num_cached_tokens_ -= q.cached;
    record(kind, q, q.num_tokens());
    pool_.free(q.seq_id, q.table);
    if (status == kSeqRejected)
      finished_early_.push_back({q.seq_id, status, std::move(reason)});
    else if (status != kSeqAborted)
      finished_.push_back({q.seq_id, status, std::move(reason)});
    // its handle is reused only once no pending step can name it
    if (pending_) {
      released_.push_back(h);
    } else {
      release(h);
    }
  }

  // Scheduler._reject: finished as REJECTED, reported by the next update().
  void reject(int32_t h, std::string reason) {
    finish(h, kSeqRejected, kReject, std::move(reason));
  }

  void release(int32_t h) { free_handles_.push_back(h); }

  // The executor's counts of the step just scheduled (kvsim/sim/executor.py: _counts, and
  // CostModelExecutor.blocks_walked: a prefill walks its sequences' tables, a decode every
  // used block), its prefill tokens and kind.
  void count_step() {
    StepInfo& s = info_;
    s = StepInfo();
    s.step = step_;
    s.num_seqs = int64_t(scheduled_.size());
    s.num_batched_tokens = num_batched_tokens_;
    s.num_preempted = int32_t(preempted_.size());
    s.num_rejected = int32_t(rejected_.size());
    if (is_prefill_) {
      s.kind = kPrefillStep;
      s.prefill_tokens = num_batched_tokens_;
      for (size_t k = 0; k < scheduled_.size(); ++k) {
        const int64_t n = num_new_tokens_[k];  // a prefill's sequences hold no cache yet
        s.prefill_causal_pairs += n * (n + 1) / 2;
        s.blocks_walked += int64_t(requests_[size_t(scheduled_[k])].table.size());
      }
      return;
    }
    // a decode: every running sequence computes one token over its non-empty cache
    s.kind = kDecodeStep;
    s.num_decode_seqs = s.num_seqs;
    s.decode_context_tokens = num_cached_tokens_ + s.num_seqs;
    s.blocks_walked = pool_.num_blocks() - pool_.num_free_blocks();
  }

  // sink.record(kind, seq_id, free blocks, (), num_tokens) of the Scheduler's events
  void record(EventKind kind, const ClassicRequest& q, int32_t num_tokens) {
    if (pool_.record_events)
      pool_.events.record(kind, q.seq_id, pool_.num_free_blocks(), nullptr, 0, num_tokens);
  }

  ClassicPool pool_;
  ClassicConfig cfg_;
  std::vector<ClassicRequest> requests_;  // by handle
  std::vector<int32_t> free_handles_;
  std::deque<int32_t> waiting_;
  std::vector<int32_t> running_;  // in admission order: the last is preempted first
  std::unordered_map<int64_t, int32_t> unfinished_;  // seq_id -> handle
  int32_t head_fits_ = -1;  // Scheduler._head_fits: the waiting head known able to fit
  std::vector<FinishedRecord> finished_early_;  // rejected, returned by the next update()
  std::vector<FinishedRecord> finished_;        // what the last update() returned
  std::vector<int32_t> released_;  // finished while a step was pending: handles to free
  bool pending_ = false;
  bool is_prefill_ = false;  // the pending (or last) step is a prefill batch
  int32_t step_ = 0;
  double time_ = 0.0;
  int64_t num_cached_tokens_ = 0;
  int64_t num_batched_tokens_ = 0;
  StepInfo info_;
  std::vector<int32_t> scheduled_, num_new_tokens_, done_;  // num_new_tokens_: a prefill's
  std::vector<int64_t> preempted_, rejected_;
};

}  // namespace kvsim

#include "classic_passes.hpp"  // the scheduling passes, defined out of line
