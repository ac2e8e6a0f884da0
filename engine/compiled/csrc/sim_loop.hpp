// The cost-mode engine loop over the compiled v1 scheduler, between two simulator events.
//
// The compiled mirror of kvsim/sim/compiled_v1.py's CompiledV1Simulation._engine_loop (itself
// Simulation._engine_loop of kvsim/sim/simulation.py): schedule a step, price it
// (StepPrices), record what the simulator records per step, let the clock run to the step's
// end, update. Python's simpy clock stays the one clock: ``run`` is given the time of the next
// simpy event (an arrival, a cancellation, the ``--until`` stop) and steps only while a step
// ends strictly before it, as Simulation._advance_clock moves the clock without a timeout only
// then; it hands control back whenever Python has something to do:
//
//   kIdle     nothing unfinished (the engine sleeps until an arrival, or the run ends);
//   kWait     a step scheduled nothing and neither preempted nor rejected (sleep until woken);
//   kPending  a step is scheduled that ends at or after the next simpy event: Python waits
//             for it with a timeout of ``pending_dt``, then calls ``finish_pending``;
//   kFinished requests finished and the caller asked to hear of it (a closed loop: a finish
//             lets a user send the next request, which moves the next simpy event);
//   kEvents   the event buffer holds at least ``chunk_events`` events (take them);
//   kReport   ``report_at`` steps are recorded (a progress report is due).
//
// Per step it records the columns SimResult holds: duration (s), filled slots (cached tokens
// plus the step's tokens), running requests, cached-free blocks as scheduled, and for steps
// that are not plain decodes their index and prefill tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "event_buffer.hpp"
#include "step_prices.hpp"
#include "v1_scheduler.hpp"

namespace kvsim {

enum LoopOutcome : int32_t {
  kIdle = 0,
  kWait = 1,
  kPending = 2,
  kFinished = 3,
  kEvents = 4,
  kReport = 5,
};

// ``Scheduler``: V1Scheduler, or ClassicScheduler (csrc/classic_scheduler.hpp), which has
// the same stepping interface.
template <class Scheduler>
class SimLoopOf {
 public:
  SimLoopOf(Scheduler* scheduler, StepPrices prices)
      : sched_(scheduler), prices_(std::move(prices)) {}
  virtual ~SimLoopOf() = default;

  // Step from ``now`` while steps end before ``next_due``; see the outcomes above.
  LoopOutcome run(double now, double next_due, int64_t report_at, size_t chunk_events,
                  bool stop_on_finish) {
    now_ = now;
    while (true) {
      if (!sched_->has_unfinished()) return kIdle;
      sched_->set_time(now_);
      const StepInfo& s = sched_->schedule();
      if (s.num_seqs == 0) {  // Simulation._engine_loop's is_empty
        const bool look_again = s.num_preempted || s.num_rejected;
        collect(sched_->update());
        if (!look_again) return kWait;
        continue;
      }
      const double dt = record(s);
      const double end = now_ + dt;
      if (!(end < next_due)) {
        pending_dt_ = dt;
        return kPending;
      }
      now_ = end;
      sched_->set_time(now_);
      const size_t before = finished.size();
      collect(sched_->update());
      if (stop_on_finish && finished.size() > before) return kFinished;
      if (sched_->pool().events.size() >= chunk_events) return kEvents;
      if (int64_t(duration_s.size()) >= report_at) return kReport;
    }
  }

  // The pending step ran to ``now``: update the scheduler.
  void finish_pending(double now) {
    now_ = now;
    sched_->set_time(now_);
    collect(sched_->update());
  }

  double now() const { return now_; }
  const StepPrices& prices() const { return prices_; }
  double pending_dt() const { return pending_dt_; }
  size_t num_steps() const { return duration_s.size(); }

  // Finished requests not yet taken, in the order update() reported them.
  std::vector<FinishedRecord> finished;

  // Per recorded (non-empty) step.
  Column<double> duration_s;
  Column<int64_t> filled_slots;
  Column<int64_t> num_running;
  Column<int64_t> cached_free_blocks;
  Column<int64_t> prefill_at;  // indices of the steps that prefill anything
  Column<int64_t> prefill_tokens;

 protected:  // OffloadSimLoop (offload_loop.hpp) steps the same records
  double record(const StepInfo& s) {
    const int64_t running = sched_->num_running();
    const int64_t cached = sched_->num_cached_tokens();
    const double dt = prices_.price(s, running, cached);
    if (s.kind != kDecodeStep) {
      prefill_at.push_back(int64_t(duration_s.size()));
      prefill_tokens.push_back(s.prefill_tokens);
    }
    duration_s.push_back(dt);
    filled_slots.push_back(cached + s.num_batched_tokens);
    num_running.push_back(running);
    cached_free_blocks.push_back(sched_->pool().num_cached_free_blocks());
    return dt;
  }

  void collect(const std::vector<FinishedRecord>& done) {
    finished.insert(finished.end(), done.begin(), done.end());
  }

  Scheduler* sched_;
  StepPrices prices_;
  double now_ = 0.0;
  double pending_dt_ = 0.0;
};

using SimLoop = SimLoopOf<V1Scheduler>;

}  // namespace kvsim
