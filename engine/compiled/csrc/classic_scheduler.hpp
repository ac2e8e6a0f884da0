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
#include "scheduler_base.hpp"
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
  bool stops_on_token = false;  // never: a classic run stops at its length limit
  std::vector<int32_t> table;  // Sequence.block_table

  int32_t num_tokens() const { return num_prompt_tokens + num_generated; }
};

class ClassicScheduler : public SchedulerBase<ClassicScheduler, ClassicPool, ClassicRequest> {
  friend class SchedulerBase<ClassicScheduler, ClassicPool, ClassicRequest>;

 public:
  ClassicScheduler(int32_t num_blocks, int32_t block_size, double watermark,
                   const ClassicConfig& config)
      : SchedulerBase(num_blocks, block_size, watermark), cfg_(config) {
    if (config.max_num_seqs < 1 || config.max_num_batched_tokens < 1)
      throw std::invalid_argument("max_num_seqs and max_num_batched_tokens must be positive");
    if (config.max_model_len == 0 || config.max_model_len < -1)
      throw std::invalid_argument("max_model_len must be positive");
  }

  // --- requests ---------------------------------------------------------------------------

  // Scheduler.add_request of a new sequence of ``num_prompt_tokens`` tokens generating at
  // most ``max_tokens`` (ignore_eos): queued behind every waiting one; ARRIVE.
  void add_request(int64_t seq_id, int32_t num_prompt_tokens, int64_t max_tokens) {
    check_new(seq_id, num_prompt_tokens, max_tokens);
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

  // --- schedule (Scheduler.schedule) -------------------------------------------------------

  const StepInfo& schedule() {
    begin_schedule();
    rejected_.clear();
    num_batched_tokens_ = 0;
    if (!waiting_.empty() && !head_blocked()) schedule_prefill();
    // nothing admitted (rejections at most): a decode step, which carries them
    is_prefill_ = !scheduled_.empty();
    if (!is_prefill_) schedule_decode();
    pending_ = true;
    count_step();
    record_step(num_batched_tokens_);
    return info_;
  }

  // --- update (Scheduler.update) -----------------------------------------------------------

  // Apply the pending step: every scheduled sequence still running advances by its tokens
  // and samples the placeholder; those at their length limit finish. Returns the requests
  // finished, those rejected while scheduling the step first (Scheduler._take_pending).
  const std::vector<FinishedRecord>& update() {
    begin_update();
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
    finish_done();
    return finished_;
  }

  // --- queries -----------------------------------------------------------------------------

  // Scheduler.has_unfinished (a rejection is reported by the update of its own step)
  bool has_unfinished() const { return !waiting_.empty() || !running_.empty(); }
  int32_t num_waiting() const { return int32_t(waiting_.size()); }

  // The pending (or last) step's tokens per scheduled request (tests): a decode's are 1.
  std::vector<int32_t> num_new_tokens() const {
    if (is_prefill_) return num_new_tokens_;
    return std::vector<int32_t>(scheduled_.size(), 1);
  }
  std::vector<int32_t> waiting() const { return {waiting_.begin(), waiting_.end()}; }

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

  // Scheduler.abort of a request not running: off the waiting queue.
  void leave_waiting(int32_t h) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), h));
    if (head_fits_ == h) head_fits_ = -1;  // Python compares identity: never again
  }

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
    report_finished(h, q, status, std::move(reason));
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

  ClassicConfig cfg_;
  std::vector<int32_t> free_handles_;
  std::deque<int32_t> waiting_;
  int32_t head_fits_ = -1;  // Scheduler._head_fits: the waiting head known able to fit
  bool is_prefill_ = false;  // the pending (or last) step is a prefill batch (num_new_tokens_
                             // holds a prefill's tokens only)
  int64_t num_batched_tokens_ = 0;
};

}  // namespace kvsim

#include "classic_passes.hpp"  // the scheduling passes, defined out of line
