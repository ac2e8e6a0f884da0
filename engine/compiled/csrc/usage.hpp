// U and the held block references at every STEP event, from the compiled event records: the
// compiled mirror of kvsim/analysis/kv_breakdown.py's PagedUsageTracker.
//
// U = Σ over sequences of min(blocks held x block_size, T), T being the sequence's final
// length (prompt plus the tokens it generates when it runs to its end; the caller gives it
// per seq_id). A sequence's held blocks change only at its ALLOCATE, APPEND_BLOCK and
// PREFIX_HIT events (it takes blocks) and its FREE (it drops its whole table), so U and the
// references are running sums over the events, read at each STEP event. The Python tracker
// computes the same sums chunk by chunk with vectorised numpy; tests/engine/
// test_compiled_usage.py holds the two equal.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "event_buffer.hpp"

namespace kvsim {

class UsageTracker {
 public:
  explicit UsageTracker(int32_t block_size) : block_size_(block_size) {}

  // T of ``seq_id`` (tokens); every sequence's before its first block event.
  void set_final_length(int64_t seq_id, int64_t final_length) {
    if (seq_id < 0) throw std::out_of_range("seq_id must be >= 0");
    if (size_t(seq_id) >= final_.size()) {
      final_.resize(std::max(size_t(seq_id) + 1, 2 * final_.size()), -1);
      held_.resize(final_.size(), 0);
    }
    final_[size_t(seq_id)] = final_length;
  }

  void consume(const EventBuffer& ev) {
    consume(ev.kind.data(), ev.seq_id.data(), ev.num_blocks.data(), ev.size());
  }

  // ``n`` events' kind, seq_id and num_blocks columns, in recording order.
  void consume(const int8_t* kind, const int32_t* seq_id, const int32_t* count, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      const int8_t k = kind[i];
      if (k == kStep) {
        usable_at_steps.push_back(usable_);
        refs_at_steps.push_back(refs_);
        continue;
      }
      int64_t delta;
      if (k == kAllocate || k == kAppendBlock || k == kPrefixHit) {
        delta = count[i];
      } else if (k == kFree) {
        delta = -int64_t(count[i]);
      } else {
        continue;
      }
      const int64_t s = seq_id[i];
      if (s < 0 || size_t(s) >= final_.size() || final_[size_t(s)] < 0)
        throw std::logic_error("a block event of a sequence without a final length");
      int64_t& held = held_[size_t(s)];
      const int64_t t = final_[size_t(s)];
      const int64_t before = std::min(held * block_size_, t);
      held += delta;
      usable_ += std::min(held * block_size_, t) - before;
      refs_ += delta;
    }
  }

  Column<int64_t> usable_at_steps;  // U at each STEP event (tokens)
  Column<int64_t> refs_at_steps;    // Σ blocks held per sequence (shared blocks count per holder)

 private:
  int64_t block_size_;
  std::vector<int64_t> final_;  // T by seq_id (-1: not given)
  std::vector<int64_t> held_;   // blocks held by seq_id
  int64_t usable_ = 0;
  int64_t refs_ = 0;
};

}  // namespace kvsim
