// What the two compiled schedulers share: the mirror of what engine/v1/scheduler.py's
// V1Scheduler inherits from engine/core/scheduler.py's Scheduler (the request handles, the
// running list, the finished records, the step's decisions, the clock the events are stamped
// with, the events of requests and steps, and the end of an update: finishing what sampled
// its last token, dropping it from the running list, releasing handles).
//
// SchedulerBase<Derived, Pool, Request> is a CRTP base: ClassicScheduler
// (classic_scheduler.hpp) and V1Scheduler (v1_scheduler.hpp) derive from it and give
// ``finish`` (Scheduler._finish: each frees its blocks its own way, the v1 one tells its
// offload connector first) and ``release`` (a handle no pending step names any more).
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "event_buffer.hpp"
#include "v1_requests.hpp"  // SeqStatus, StepInfo, FinishedRecord

namespace kvsim {

template <class Derived, class Pool, class Request>
class SchedulerBase {
 public:
  // Scheduler.abort: a waiting or running request is finished as ABORTED and its blocks
  // freed now; false if ``seq_id`` is unknown or finished. One aborted between schedule()
  // and update() is skipped by that update(). (The derived scheduler's ``leave_waiting``
  // takes a request that is not running off its waiting queue.)
  bool abort(int64_t seq_id) {
    const auto found = unfinished_.find(seq_id);
    if (found == unfinished_.end()) return false;
    const int32_t h = found->second;
    if (requests_[size_t(h)].status == kSeqRunning) {
      running_.erase(std::find(running_.begin(), running_.end(), h));
    } else {
      derived().leave_waiting(h);
    }
    derived().finish(h, kSeqAborted, kAbort, "aborted");
    return true;
  }

  // The clock the events that follow are stamped with (EventRecorder's clock()).
  void set_time(double time_s) {
    time_ = time_s;
    pool_.events.begin_step(step_, time_);
  }

  int32_t num_running() const { return int32_t(running_.size()); }
  int64_t num_cached_tokens() const { return num_cached_tokens_; }  // Scheduler's counter
  int32_t step() const { return step_; }
  bool pending() const { return pending_; }
  const StepInfo& last_step() const { return info_; }
  Pool& pool() { return pool_; }

  // The pending (or last) step's decisions (tests): scheduled handles in batch order,
  // preempted and rejected seq_ids, the running handles.
  const std::vector<int32_t>& scheduled() const { return scheduled_; }
  const std::vector<int64_t>& preempted() const { return preempted_; }
  const std::vector<int64_t>& rejected() const { return rejected_; }
  const std::vector<int32_t>& running() const { return running_; }
  const Request& request(int32_t h) const { return requests_.at(size_t(h)); }
  // The handle of an unfinished request, -1 if none.
  int32_t handle_of(int64_t seq_id) const {
    const auto found = unfinished_.find(seq_id);
    return found == unfinished_.end() ? -1 : found->second;
  }

  // The STEP rows' step kind and batch size, one per STEP event in the pool's buffer
  // (EventRecorder.step_columns keeps them beside the event row).
  Column<int8_t> step_kinds;
  Column<int64_t> step_num_seqs;

 protected:
  template <class... PoolArgs>
  explicit SchedulerBase(PoolArgs&&... pool_args)
      : pool_(std::forward<PoolArgs>(pool_args)...) {}

  // Scheduler.add_request, Sequence and SamplingParams refuse these.
  void check_new(int64_t seq_id, int32_t num_prompt_tokens, int64_t max_tokens) const {
    if (unfinished_.count(seq_id))
      throw std::invalid_argument("sequence " + std::to_string(seq_id) +
                                  " is already queued or running");
    if (num_prompt_tokens < 1) throw std::invalid_argument("prompt_token_ids must not be empty");
    if (max_tokens < 1) throw std::invalid_argument("max_tokens must be a positive integer");
  }

  // sink.record(kind, seq_id, free blocks, (), num_tokens) of the Scheduler's events
  void record(EventKind kind, const Request& q, int32_t num_tokens) {
    if (pool_.record_events)
      pool_.events.record(kind, q.seq_id, pool_.num_free_blocks(), nullptr, 0, num_tokens);
  }

  // Scheduler.schedule's sink.record_step for a step that scheduled anything
  // (EventRecorder keeps its kind and batch size aside).
  void record_step(int64_t num_batched_tokens) {
    if (!pool_.record_events || scheduled_.empty()) return;
    pool_.events.record(kStep, kNoSeq, pool_.num_free_blocks(), nullptr, 0,
                        int32_t(num_batched_tokens));
    step_kinds.push_back(info_.kind);
    step_num_seqs.push_back(info_.num_seqs);
  }

  // Scheduler._finish's bookkeeping once ``q`` is finished and its blocks freed: the
  // finished record (a rejection is reported by the next update, an abort by none) and
  // its handle, reused only once no pending step can name it.
  void report_finished(int32_t h, const Request& q, SeqStatus status, std::string reason) {
    if (status == kSeqRejected)
      finished_early_.push_back({q.seq_id, status, std::move(reason)});
    else if (status != kSeqAborted)
      finished_.push_back({q.seq_id, status, std::move(reason)});
    if (pending_) {
      released_.push_back(h);
    } else {
      derived().release(h);
    }
  }

  // The end of Scheduler.update: Scheduler._finish_sampled of the requests in ``done_``
  // (stopped on their token, else at their length limit), then _drop_finished (the running
  // order kept), then the handles finished while the step was pending are released.
  void finish_done() {
    for (const int32_t h : done_) {
      const bool stop = requests_[size_t(h)].stops_on_token;
      derived().finish(h, stop ? kSeqStopped : kSeqLength, kFinish, stop ? "stop" : "length");
    }
    if (!done_.empty()) {
      running_.erase(std::remove_if(running_.begin(), running_.end(),
                                    [this](int32_t h) {
                                      return requests_[size_t(h)].status != kSeqRunning;
                                    }),
                     running_.end());
    }
    for (const int32_t h : released_) derived().release(h);
    released_.clear();
  }

  // The schedule's start: a new step, its decisions empty.
  void begin_schedule() {
    if (pending_) throw std::logic_error("a step was scheduled but never updated");
    ++step_;
    pool_.events.begin_step(step_, time_);
    scheduled_.clear();
    num_new_tokens_.clear();
    preempted_.clear();
  }

  // The update's start: what it returns begins with the rejections since the last one.
  void begin_update() {
    if (!pending_) throw std::logic_error("update() without a scheduled step");
    pending_ = false;
    finished_.swap(finished_early_);
    finished_early_.clear();
    done_.clear();
  }

  Derived& derived() { return static_cast<Derived&>(*this); }

  Pool pool_;
  std::vector<Request> requests_;  // by handle
  std::vector<int32_t> running_;   // in admission order: the last is preempted first
  std::unordered_map<int64_t, int32_t> unfinished_;  // seq_id -> handle
  std::vector<FinishedRecord> finished_early_;  // rejected, returned by the next update()
  std::vector<FinishedRecord> finished_;        // what the last update() returned
  std::vector<int32_t> released_;  // finished while a step was pending: handles to free
  bool pending_ = false;
  int32_t step_ = 0;
  double time_ = 0.0;
  int64_t num_cached_tokens_ = 0;
  StepInfo info_;
  // the step's decisions (done_: what sampled its last token in the update)
  std::vector<int32_t> scheduled_, num_new_tokens_, done_;
  std::vector<int64_t> preempted_, rejected_;
};

}  // namespace kvsim
