// The cost-mode engine loop with KV offloading, between two simulator events: a mirror of
// kvsim/sim/offload_loop.py's offload_engine_loop over the compiled offloading scheduler
// (v1_offload_passes.hpp) and the worker of engine/offload/worker.py (OffloadWorker) on the
// compiled transfer link (transfer_link.hpp), whose docstrings are the specification.
//
// As SimLoop (sim_loop.hpp), ``run`` steps while nothing the simpy clock must see happens, and
// hands control back otherwise; it keeps where it stopped in a step (its phase) and goes on
// from there at the next ``run``, at the time Python's clock then reads:
//
//   kPending    the step waits ``pending_dt`` s (a flush that ends, or a step that ends, at
//               or after the next simpy event): Python yields env.timeout(pending_dt);
//   kIdleUntil  a step with nothing to compute waits for the next transfer completion, due
//               at or after the next simpy event: Python yields env.any_of([wake,
//               env.timeout(pending_dt)]) (woken early by an arrival);
//   kWait       that step has no completion to wait for: Python yields the wake event;
//   kIdle, kFinished, kEvents, kReport as SimLoop's.
//
// Each clock move that Python would make with a timeout is made as ``now + delay``, the float
// simpy's timeout gives; a wait until a time t takes delay_until(now, t), as Python's.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <vector>

#include "event_buffer.hpp"
#include "sim_loop.hpp"
#include "transfer_link.hpp"

namespace kvsim {

constexpr int32_t kIdleUntil = 6;  // a LoopOutcome beyond SimLoop's (see above)

// kvsim/sim/offload_loop.py's delay_until: the delay a timeout at ``now`` needs to land at or
// after ``t`` (``t - now`` can land one float step short, before the link's clock).
inline double delay_until(double now, double t) {
  if (t <= now) return 0.0;
  double delay = t - now;
  while (now + delay < t) delay = std::nextafter(delay, std::numeric_limits<double>::infinity());
  return delay;
}

// engine/offload/worker.py's OffloadWorker: submits each step's jobs to the link and
// records every job's timing, in submission order.
class OffloadWorker {
 public:
  OffloadWorker(const OffloadConnector* connector, double read_bytes_per_s,
                double write_bytes_per_s, double latency_s, int64_t bytes_per_block)
      : connector_(connector),
        link_(read_bytes_per_s, write_bytes_per_s, latency_s),
        bytes_per_block_(bytes_per_block) {}

  // start_step: returns when the step's forward pass starts (s).
  double start_step(const OffloadMeta& meta, double now) {
    collect(now);
    const std::unordered_set<int64_t>& flush = meta.jobs_to_flush;
    for (const int64_t j : deferred_) submit(j, now);
    for (const int64_t j : meta.store_jobs)
      if (flush.count(j)) submit(j, now);
    deferred_.clear();
    for (const int64_t j : meta.store_jobs)
      if (!flush.count(j)) deferred_.push_back(j);
    double start = now;
    waiting_.clear();
    for (const int64_t j : flush)
      if (submitted(j) && std::isnan(completed_s[size_t(row_[size_t(j)])])) waiting_.insert(j);
    while (!waiting_.empty()) {
      double t;
      if (!link_.next_completion_time(t))
        throw std::logic_error("flushed jobs were never submitted");
      start = std::max(start, t);
      collect(t);
      for (const int64_t j : completed_) waiting_.erase(j);
    }
    collect(start);
    for (const int64_t j : meta.load_jobs) submit(j, start);
    return start;
  }

  // poll: the jobs completed by ``now`` not reported before, in completion order.
  const std::vector<int64_t>& poll(double now) {
    collect(now);
    reported_.swap(completed_);
    completed_.clear();
    return reported_;
  }

  bool next_completion_time(double& out) { return link_.next_completion_time(out); }

  // has_unreported: jobs collected from the link that no poll has reported yet.
  bool has_unreported() const { return !completed_.empty(); }

  // Every job submitted, in submission order (JobTiming's fields; NaN: not completed).
  Column<int64_t> job_id, seq_id, nbytes;
  Column<int8_t> is_store;
  Column<double> submitted_s, completed_s;
  Column<int64_t> num_keys, num_blocks;  // per job, to cut the flat columns below
  Column<int64_t> keys;                  // every job's chunk keys, in order
  Column<int32_t> gpu_block_ids;         // every job's GPU blocks, in order

 private:
  bool submitted(int64_t j) const { return size_t(j) < row_.size() && row_[size_t(j)] >= 0; }

  void submit(int64_t j, double now) {
    const OffloadJob& job = connector_->job(j);
    const int64_t bytes = int64_t(job.gpu_block_ids.size()) * bytes_per_block_;
    link_.submit(j, job.is_store ? 1 : 0, double(bytes), now);
    if (size_t(j) >= row_.size()) row_.resize(size_t(j) + 1, -1);
    row_[size_t(j)] = int64_t(job_id.size());
    job_id.push_back(j);
    seq_id.push_back(job.seq_id);
    nbytes.push_back(bytes);
    is_store.push_back(job.is_store);
    submitted_s.push_back(now);
    completed_s.push_back(std::numeric_limits<double>::quiet_NaN());
    num_keys.push_back(int64_t(job.keys.size()));
    num_blocks.push_back(int64_t(job.gpu_block_ids.size()));
    keys.append(job.keys.data(), job.keys.size());
    gpu_block_ids.append(job.gpu_block_ids.data(), job.gpu_block_ids.size());
  }

  void collect(double now) {
    for (const LinkCompletion& c : link_.advance(now)) {
      const_cast<double*>(completed_s.data())[row_[size_t(c.job)]] = c.time;
      completed_.push_back(c.job);
    }
  }

  const OffloadConnector* connector_;
  SharedLink link_;
  int64_t bytes_per_block_;
  std::vector<int64_t> deferred_, completed_, reported_;
  std::unordered_set<int64_t> waiting_;
  std::vector<int64_t> row_;  // job id -> its row in the columns (-1: not submitted)
};

class OffloadSimLoop : public SimLoop {
 public:
  OffloadSimLoop(V1Scheduler* scheduler, StepPrices prices, double read_bytes_per_s,
                 double write_bytes_per_s, double latency_s, int64_t bytes_per_block)
      : SimLoop(scheduler, std::move(prices)),
        worker(connector_of(scheduler), read_bytes_per_s, write_bytes_per_s, latency_s,
               bytes_per_block) {}

  // offload_engine_loop from ``now`` (where the last run stopped) while nothing reaches
  // ``next_due``; see the outcomes above.
  int32_t run(double now, double next_due, int64_t report_at, size_t chunk_events,
              bool stop_on_finish) {
    now_ = now;
    while (true) {
      switch (phase_) {
        case kTop: {
          if (!sched_->has_unfinished()) return kIdle;
          sched_->set_time(now_);
          step_ = &sched_->schedule();
          const OffloadMeta& meta = sched_->offload_meta();
          for (const int64_t j : meta.load_jobs) price_load(j);
          const double start = worker.start_step(meta, now_);
          phase_ = kAfterFlush;
          if (start > now_) {
            const double wait = delay_until(now_, start);
            if (!(now_ + wait < next_due)) {
              pending_dt_ = wait;
              return kPending;
            }
            now_ = now_ + wait;
          }
          break;
        }
        case kAfterFlush: {
          const StepInfo& s = *step_;
          if (s.num_seqs == 0) {
            phase_ = kAfterIdle;
            const bool idle = !s.num_preempted && !s.num_rejected &&
                              sched_->offload_meta().store_jobs.empty() &&
                              !worker.has_unreported();
            if (idle && sched_->has_unfinished()) {
              double due;
              if (!worker.next_completion_time(due)) return kWait;
              const double wait = delay_until(now_, due);
              if (!(now_ + wait < next_due)) {
                pending_dt_ = wait;
                return kIdleUntil;
              }
              now_ = now_ + wait;
            }
            break;
          }
          completed_ = worker.poll(now_);
          // The executor prices the step now: a flush wait that returned to Python may have
          // let an abort free blocks since schedule() counted them (the walk reads the
          // blocks used now; the other counts read the scheduled requests, which keep them)
          StepInfo priced = s;
          priced.blocks_walked = sched_->pool().num_blocks() - sched_->pool().num_free_blocks();
          const double dt = record(priced);
          tier_chunks.push_back(sched_->connector()->tier.num_held());
          tier_evictions.push_back(sched_->connector()->tier.num_evicted);
          phase_ = kAfterStep;
          if (!(now_ + dt < next_due)) {
            pending_dt_ = dt;
            return kPending;
          }
          now_ = now_ + dt;
          break;
        }
        case kAfterIdle:
          if (update(worker.poll(now_)) && stop_on_finish) return kFinished;
          break;
        case kAfterStep:
          if (update(completed_) && stop_on_finish) return kFinished;
          if (sched_->pool().events.size() >= chunk_events) return kEvents;
          if (int64_t(duration_s.size()) >= report_at) return kReport;
          break;
      }
    }
  }

  OffloadWorker worker;
  // TierTrace: the tier's chunks and evictions (cumulative) at each executed step.
  Column<int64_t> tier_chunks, tier_evictions;
  // Each load's request as it was admitted, for its recompute price (TierTrace.price_loads,
  // priced in Python: prefill_time_s): job id, tokens loaded, GPU prefix-hit tokens.
  Column<int64_t> load_job, load_tokens, load_cached;

 private:
  enum Phase { kTop, kAfterFlush, kAfterIdle, kAfterStep };

  static const OffloadConnector* connector_of(V1Scheduler* scheduler) {
    if (scheduler->connector() == nullptr)
      throw std::logic_error("the scheduler has no offload tier (enable_offload first)");
    return scheduler->connector();
  }

  // The step's update at ``now_`` with the jobs reported done; whether requests finished.
  bool update(const std::vector<int64_t>& completed) {
    phase_ = kTop;
    sched_->set_time(now_);
    const size_t before = finished.size();
    collect(sched_->update(completed));
    return finished.size() > before;
  }

  void price_load(int64_t j) {
    const int64_t seq = sched_->connector()->job(j).seq_id;
    const V1Request& q = sched_->request(sched_->handle_of(seq));
    load_job.push_back(j);
    load_tokens.push_back(q.offload_hit_tokens);
    load_cached.push_back(q.prefix_hit_tokens);
  }

  Phase phase_ = kTop;
  const StepInfo* step_ = nullptr;
  std::vector<int64_t> completed_;  // polled at the forward's start, reported by its update
};

}  // namespace kvsim
