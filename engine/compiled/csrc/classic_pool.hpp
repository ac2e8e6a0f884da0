// The classic scheduler's block pool: a FIFO free queue, blocks owned by one sequence each.
//
// The compiled mirror of engine/core/block_manager.py's BlockManager as the classic scheduler
// uses it (its non-v1 methods): a fresh pool hands out blocks 0, 1, 2, ... from the front of
// the free queue; a freed table goes to the back in table order; every reference count is 0
// or 1, so no block is shared and nothing is cached. The tables themselves belong to the
// scheduler's requests (csrc/classic_scheduler.hpp) and are passed in, as the Python
// BlockManager reads and writes ``Sequence.block_table``. Events (ALLOCATE, APPEND_BLOCK,
// FREE) are those the Python methods record, with the same free counts.
//
// The queue is a ring over block ids: it never holds more than every block, so a slot array
// of ``num_blocks`` entries with a head and a count is the Python list read from ``_head``
// without its compaction.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "event_buffer.hpp"

namespace kvsim {

class ClassicPool {
 public:
  // BlockManager.__init__: ``watermark`` is a fraction of ``num_blocks`` kept free when
  // admitting prefills.
  ClassicPool(int32_t num_blocks, int32_t block_size, double watermark)
      : num_blocks_(num_blocks), block_size_(block_size), num_free_(num_blocks) {
    if (num_blocks < 1) throw std::invalid_argument("num_blocks must be positive");
    if (block_size < 1) throw std::invalid_argument("block_size must be positive");
    if (!(watermark >= 0.0 && watermark < 1.0))
      throw std::invalid_argument("watermark must be in [0, 1)");
    watermark_blocks_ = static_cast<int32_t>(watermark * double(num_blocks));
    ring_.resize(size_t(num_blocks));
    for (int32_t b = 0; b < num_blocks; ++b) ring_[size_t(b)] = b;
  }

  // --- queries ----------------------------------------------------------------------------

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  int32_t watermark_blocks() const { return watermark_blocks_; }
  int32_t num_free_blocks() const { return num_free_; }
  // The classic pool caches nothing (SimLoop reads this of every pool).
  int32_t num_cached_free_blocks() const { return 0; }

  // blocks_needed(num_tokens, block_size)
  int64_t blocks_needed(int64_t num_tokens) const {
    return (num_tokens + block_size_ - 1) / block_size_;
  }
  // BlockManager.can_allocate: a prefill of ``num_tokens`` fits, the watermark kept free.
  bool can_allocate(int64_t num_tokens) const {
    return num_free_ - blocks_needed(num_tokens) >= watermark_blocks_;
  }
  // BlockManager.can_ever_allocate: it would fit with every other block free.
  bool can_ever_allocate(int64_t num_tokens) const {
    return num_blocks_ - blocks_needed(num_tokens) >= watermark_blocks_;
  }

  // The free queue front to back (tests).
  std::vector<int32_t> free_queue() const {
    std::vector<int32_t> out;
    out.reserve(size_t(num_free_));
    for (int32_t i = 0; i < num_free_; ++i) out.push_back(ring_[slot(i)]);
    return out;
  }

  // --- per sequence -----------------------------------------------------------------------

  // BlockManager.allocate_for_prefill: ``table`` (empty) gets the blocks for
  // ``num_tokens`` tokens from the front of the queue; ALLOCATE.
  void allocate(int64_t seq_id, int32_t num_tokens, std::vector<int32_t>& table) {
    if (!table.empty()) throw std::logic_error("the sequence already holds blocks");
    const int64_t n = blocks_needed(num_tokens);
    if (n > num_free_) throw std::logic_error("allocating more blocks than are free");
    table.reserve(size_t(n));
    for (int64_t i = 0; i < n; ++i) table.push_back(pop_front());
    if (record_events)
      events.record(kAllocate, seq_id, num_free_, table.data(), table.size(), num_tokens);
  }

  // BlockManager.append_block: one more block at the end of ``table``; APPEND_BLOCK.
  int32_t append_block(int64_t seq_id, std::vector<int32_t>& table) {
    if (num_free_ == 0) throw std::logic_error("a sequence needs a block, none is free");
    const int32_t b = pop_front();
    table.push_back(b);
    if (record_events) events.record(kAppendBlock, seq_id, num_free_, &b, 1, 1);
    return b;
  }

  // BlockManager.free_sequence: ``table``'s blocks to the back of the queue in table order;
  // FREE. An empty table: a no-op.
  void free(int64_t seq_id, std::vector<int32_t>& table) {
    if (table.empty()) return;
    if (size_t(num_free_) + table.size() > size_t(num_blocks_))
      throw std::logic_error("freeing more blocks than are held");
    for (const int32_t b : table) ring_[slot(num_free_++)] = b;
    if (record_events) events.record(kFree, seq_id, num_free_, table.data(), table.size(), 0);
    table.clear();
  }

  EventBuffer events;
  bool record_events = true;  // false: as the Python path with no event sink

 private:
  // The ring slot of the queue's ``i``-th entry.
  size_t slot(int32_t i) const {
    int64_t at = int64_t{head_} + i;
    if (at >= num_blocks_) at -= num_blocks_;
    return size_t(at);
  }

  int32_t pop_front() {
    const int32_t b = ring_[size_t(head_)];
    if (++head_ == num_blocks_) head_ = 0;
    --num_free_;
    return b;
  }

  int32_t num_blocks_;
  int32_t block_size_;
  int32_t watermark_blocks_ = 0;
  std::vector<int32_t> ring_;  // the free queue: num_free_ entries from head_, wrapping
  int32_t head_ = 0;
  int32_t num_free_;
};

}  // namespace kvsim
