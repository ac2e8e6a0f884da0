// The compiled v1 scheduler's configuration, per-request state, step summary and waiting
// queue (v1_scheduler.hpp).
//
// V1Request holds what engine/core/sequence.py's Sequence holds for a placeholder-token run
// (every sampled token is one fixed id): token counts instead of token lists, the status,
// the priority and arrival time the priority policy orders by. The block table and the
// block keys live in the BlockPool, under the same handle.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvsim {

// engine/core/sequence.py's SequenceStatus, in its declaration order.
enum SeqStatus : int8_t {
  kSeqWaiting = 0,
  kSeqRunning = 1,
  kSeqStopped = 2,   // FINISHED_STOPPED
  kSeqLength = 3,    // FINISHED_LENGTH
  kSeqAborted = 4,   // FINISHED_ABORTED
  kSeqRejected = 5,  // FINISHED_REJECTED
  kSeqWaitingForKv = 6,  // WAITING_FOR_KV: holding blocks while a KV connector loads them
};

// engine/core/event_kinds.py's StepKind, by value.
enum StepKindCode : int8_t { kPrefillStep = 0, kDecodeStep = 1, kMixedStep = 2 };

// engine/core/scheduler_output.py's SchedulerConfig (the v1 options) and the BlockManager's
// watermark. max_model_len < 0: none.
struct V1Config {
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 8192;
  int32_t max_model_len = -1;
  bool enable_chunked_prefill = true;
  int32_t long_prefill_token_threshold = 0;
  bool priority = false;  // policy "priority" (else "fcfs")
  double watermark = 0.0;
};

// One scheduled step, read between schedule() and update(). The first eight are
// kvsim.costmodel.BatchShape's fields as kvsim/sim/executor.py's _counts computes them.
struct StepInfo {
  int64_t num_seqs = 0;
  int64_t num_batched_tokens = 0;
  int64_t num_decode_seqs = 0;        // one token over a non-empty cache
  int64_t decode_context_tokens = 0;  // their cached tokens plus one each
  int64_t prefill_causal_pairs = 0;   // sum of n (n + 1) / 2 over the others
  int64_t prefill_cached_pairs = 0;   // sum of n c
  int64_t prefill_cached_tokens = 0;  // sum of c
  int64_t blocks_walked = 0;          // BlockManager.num_used_blocks (the executor's, v1)
  int64_t prefill_tokens = 0;         // kvsim/sim/simulation.py's prefill_tokens
  int8_t kind = kDecodeStep;          // scheduler_output.step_kind
  int32_t num_preempted = 0;
  int32_t num_rejected = 0;
  int32_t step = 0;
};

struct V1Request {
  int64_t seq_id = 0;
  int32_t num_prompt_tokens = 0;
  int32_t num_generated = 0;        // len(Sequence.generated_token_ids)
  int32_t cached = 0;               // Sequence.cached_token_count
  int32_t finish_cached_count = 0;  // Sequence._finish_cached_count
  SeqStatus status = kSeqWaiting;
  bool stops_on_token = false;  // the placeholder token is one of its stop ids
  int64_t priority = 0;
  double arrival_time = 0.0;
  int32_t num_preemptions = 0;
  int32_t prefix_hit_tokens = 0;  // Sequence.prefix_hit_tokens
  int32_t offload_hit_tokens = 0;  // Sequence.offload_hit_tokens (a KV connector's load)
  std::string id_text;            // str(seq_id): the priority queue's last tie-break

  // Sequence.num_tokens
  int32_t num_tokens() const { return num_prompt_tokens + num_generated; }
};

// A request finished (or rejected) and reported by update(): its seq_id, status and
// Sequence.finish_reason ("length", "stop", or a rejection's reason).
struct FinishedRecord {
  int64_t seq_id;
  SeqStatus status;
  std::string reason;
};

// The v1 waiting queue: a deque under FCFS (V1Scheduler's inherited ``_waiting``), and
// under priority engine/v1/request_queue.py's PriorityWaitingQueue, lowest (priority,
// arrival_time, str(seq_id)) first; that key is a total order among unfinished requests,
// so an ordered set pops exactly as its heap does. Entries are request handles.
class WaitingQueue {
 public:
  WaitingQueue(const std::vector<V1Request>* requests, bool by_priority)
      : by_priority_(by_priority), heap_(PriorityLess{requests}) {}

  bool empty() const { return by_priority_ ? heap_.empty() : fifo_.empty(); }
  size_t size() const { return by_priority_ ? heap_.size() : fifo_.size(); }

  // deque.append / PriorityWaitingQueue.append
  void push_back(int32_t h) {
    if (by_priority_) {
      heap_.insert(h);
    } else {
      fifo_.push_back(h);
    }
  }
  // deque.appendleft / PriorityWaitingQueue.appendleft (a preempted request keeps its place
  // in the priority order)
  void push_front(int32_t h) {
    if (by_priority_) {
      heap_.insert(h);
    } else {
      fifo_.push_front(h);
    }
  }
  // _waiting[0]
  int32_t front() const {
    if (empty()) throw std::logic_error("the waiting queue is empty");
    return by_priority_ ? *heap_.begin() : fifo_.front();
  }
  // _waiting.popleft()
  void pop_front() {
    if (by_priority_) {
      heap_.erase(heap_.begin());
    } else {
      fifo_.pop_front();
    }
  }
  // _waiting.remove(seq)
  void remove(int32_t h) {
    if (by_priority_) {
      heap_.erase(h);
      return;
    }
    const auto at = std::find(fifo_.begin(), fifo_.end(), h);
    if (at == fifo_.end()) throw std::logic_error("the request is not waiting");
    fifo_.erase(at);
  }
  // In queue order (tests).
  std::vector<int32_t> to_vector() const {
    return by_priority_ ? std::vector<int32_t>(heap_.begin(), heap_.end())
                        : std::vector<int32_t>(fifo_.begin(), fifo_.end());
  }

 private:
  // (priority, arrival_time, str(seq_id)) < ..., as Python compares the heap's tuples
  struct PriorityLess {
    const std::vector<V1Request>* requests;
    bool operator()(int32_t a, int32_t b) const {
      const V1Request& x = (*requests)[size_t(a)];
      const V1Request& y = (*requests)[size_t(b)];
      if (x.priority != y.priority) return x.priority < y.priority;
      if (x.arrival_time != y.arrival_time) return x.arrival_time < y.arrival_time;
      return x.id_text < y.id_text;
    }
  };

  bool by_priority_;
  std::deque<int32_t> fifo_;
  std::set<int32_t, PriorityLess> heap_;
};

}  // namespace kvsim
