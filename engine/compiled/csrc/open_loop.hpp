// An open-loop replay's clock inside the core: the arrivals and the engine loop of
// kvsim/sim/inline_clock.py's run_inline, without a Python call per arrival or per pending step.
//
// run_inline (the readable rule, which tests/kvsim/test_inline_clock.py holds equal to simpy's
// driver) runs two processes over one heap of (time, order, what) entries, simpy's own order:
// ARRIVE (the arrival process resumes: it submits every request due by now, then waits for
// the next), WAKE (a waiting engine is woken by a submission or by the close of arrivals) and
// STEP (the step SimLoop left pending has ended). OpenLoopClock runs the same heap, entry for
// entry, with the requests given as columns (ArrivalColumns: the trace's arrival times,
// lengths, priorities, and where prefix caching applies the keys Python's key source gives),
// so every request is submitted, every step scheduled and every pending step finished at the
// same float time and in the same order as run_inline does, and the core records the same
// events. Where run_inline hands control to Python after a SimLoop::run (finished requests,
// events to take, a progress report), ``drive`` returns kOpenLoopYield if Python has
// something to do there (at least ``chunk_events`` events, or ``next_report`` steps
// recorded): Python takes them and calls ``drive`` again, which resumes at that point.
// tests/kvsim/test_inline_clock.py holds it, run_inline and simpy's driver equal.
#pragma once

#include <cstdint>
#include <limits>
#include <queue>
#include <stdexcept>
#include <vector>

#include "sim_loop.hpp"
#include "usage.hpp"
#include "v1_scheduler.hpp"

namespace kvsim {

// The requests of an open-loop trace in arrival order; request i is seq_id i. The arrays are
// the caller's and must outlive the clock.
struct ArrivalColumns {
  const double* arrival_time_s = nullptr;
  const int32_t* prompt_tokens = nullptr;
  const int64_t* output_tokens = nullptr;
  const int64_t* priority = nullptr;
  const int64_t* final_length = nullptr;  // T per request, for the usage tracker (or null)
  // Prefix keys, or null where no request has any: request i's are key_ids[key_start[i] ..
  // key_start[i + 1]) at key_block_size[i] tokens each; key_block_size[i] == 0: none.
  const int64_t* key_start = nullptr;
  const int64_t* key_ids = nullptr;
  const int32_t* key_block_size = nullptr;
  size_t size = 0;
};

enum OpenLoopOutcome : int32_t { kOpenLoopDone = 0, kOpenLoopYield = 1 };

class OpenLoopClock {
 public:
  // ``usage``: where final lengths go (null without usage tracking); ``start``: the clock's
  // time (s) when the replay starts.
  OpenLoopClock(V1Scheduler* scheduler, SimLoop* loop, UsageTracker* usage,
                ArrivalColumns arrivals, double start)
      : sched_(scheduler), loop_(loop), usage_(usage), in_(arrivals), now_(start) {
    // run_inline starts the engine first; the arrival process's start is the one entry
    push(now_, kArrive);
  }

  // Replay until the run ends (kOpenLoopDone) or Python has something to do (kOpenLoopYield;
  // call again once done). ``report_every``: SimLoop::run's report interval in steps (0:
  // none); ``next_report``: the recorded steps at which a progress report is due.
  int32_t drive(int64_t report_every, int64_t next_report, size_t chunk_events) {
    while (true) {
      switch (stage_) {
        case kResumeEngine:
          stage_ = kRunEngine;
          if (finish_pending_) {
            loop_->finish_pending(now_);
            if (python_due(next_report, chunk_events)) return kOpenLoopYield;
          }
          break;
        case kRunEngine: {
          // the loop stops at the report's step itself (a multiple of report_every), as
          // the Python loop reports every 4,096 steps, not report_every after a return
          const int64_t report_at =
              report_every ? next_report : std::numeric_limits<int64_t>::max();
          const double next_due =
              heap_.empty() ? std::numeric_limits<double>::infinity() : heap_.top().time;
          outcome_ = loop_->run(now_, next_due, report_at, chunk_events, false);
          now_ = loop_->now();
          if (outcome_ == kPending) {
            push(now_ + loop_->pending_dt(), kStep);
            finish_pending_ = true;
            stage_ = kPop;
            break;
          }
          stage_ = kAfterRun;
          if (python_due(next_report, chunk_events)) return kOpenLoopYield;
          break;
        }
        case kAfterRun:
          if (outcome_ == kIdle && all_submitted_) {
            stage_ = kDone;
            return kOpenLoopDone;
          }
          if (outcome_ == kIdle || outcome_ == kWait) {
            waiting_ = true;
            finish_pending_ = false;
            stage_ = kPop;
          } else {
            stage_ = kRunEngine;
          }
          break;
        case kPop: {
          if (heap_.empty())  // run_inline's heappop would raise: nothing can wake the engine
            throw std::runtime_error("the engine waits and nothing is due");
          const Entry e = heap_.top();
          heap_.pop();
          now_ = e.time;
          if (e.what == kArrive)
            arrive();
          else
            stage_ = kResumeEngine;
          break;
        }
        case kDone:
          return kOpenLoopDone;
      }
    }
  }

  double now() const { return now_; }
  size_t num_submitted() const { return next_; }
  bool all_submitted() const { return all_submitted_; }

 private:
  enum What : int8_t { kArrive = 0, kWake = 1, kStep = 2 };
  enum Stage : int8_t { kResumeEngine, kRunEngine, kAfterRun, kPop, kDone };
  struct Entry {
    double time;
    int64_t order;  // simpy's event id: at one time, the first scheduled goes first
    What what;
  };
  struct Later {
    bool operator()(const Entry& a, const Entry& b) const {
      return a.time > b.time || (a.time == b.time && a.order > b.order);
    }
  };

  void push(double time, What what) { heap_.push({time, order_++, what}); }

  // What run_inline's Python does after a SimLoop::run or finish_pending: take the events
  // (at least ``chunk_events`` of them), report progress.
  bool python_due(int64_t next_report, size_t chunk_events) const {
    return sched_->pool().events.size() >= chunk_events ||
           int64_t(loop_->num_steps()) >= next_report;
  }

  // Simulation._open_loop from its resumption to its next yield.
  void arrive() {
    while (next_ < in_.size) {
      const double delay = in_.arrival_time_s[next_] - now_;
      if (delay > 0) {
        push(now_ + delay, kArrive);  // env.timeout(delay)
        return;
      }
      submit(next_++);
      if (waiting_) {  // the first submission wakes the engine
        waiting_ = false;
        push(now_, kWake);
      }
    }
    all_submitted_ = true;  // close_arrivals(), then the process ends
    if (waiting_) {
      waiting_ = false;
      push(now_, kWake);
    }
  }

  // CompiledV1Simulation.submit of request i (seq_id i).
  void submit(size_t i) {
    const int64_t seq_id = int64_t(i);
    if (usage_ != nullptr && in_.final_length != nullptr)
      usage_->set_final_length(seq_id, in_.final_length[i]);
    sched_->set_time(now_);
    if (in_.key_start != nullptr && in_.key_block_size[i] > 0) {
      const int64_t start = in_.key_start[i];
      sched_->add_hash_id_request(seq_id, in_.prompt_tokens[i], in_.key_ids + start,
                                  int32_t(in_.key_start[i + 1] - start), in_.key_block_size[i],
                                  in_.output_tokens[i], now_, in_.priority[i]);
    } else {
      sched_->add_unique_request(seq_id, in_.prompt_tokens[i], in_.output_tokens[i], now_,
                                 in_.priority[i]);
    }
  }

  V1Scheduler* sched_;
  SimLoop* loop_;
  UsageTracker* usage_;
  ArrivalColumns in_;
  double now_;
  std::priority_queue<Entry, std::vector<Entry>, Later> heap_;
  int64_t order_ = 0;
  size_t next_ = 0;  // the next request to submit
  Stage stage_ = kResumeEngine;
  int32_t outcome_ = kIdle;  // the last SimLoop::run's
  bool waiting_ = false;         // the engine waits for a WAKE nothing has scheduled yet
  bool finish_pending_ = false;  // the engine resumes from its pending step
  bool all_submitted_ = false;
};

}  // namespace kvsim
