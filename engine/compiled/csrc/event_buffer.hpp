// The compiled path's event records: growable columns, one value per event per column.
//
// The columns are those of EventRecorder's packed chunks (engine/core/event_rows.py:
// time_s, step, kind, seq_id, free_blocks, num_tokens, num_blocks), the block ids of every
// event flattened in event order, and the keys of every CACHE / EVICT event's blocks (what
// EventRecorder(keep_block_hashes=True).block_hashes() holds). Each column is one malloc'd
// array that is handed over whole (``release``): the Cython binding wraps it in a numpy
// array that frees it, so no row is ever copied on its way to numpy or pyarrow.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <type_traits>

namespace kvsim {

// The event kinds of engine/core/event_kinds.py (EventKind), by value.
enum EventKind : int8_t {
  kArrive = 0,
  kAdmit = 1,
  kResume = 2,
  kAllocate = 3,
  kAppendBlock = 4,
  kFree = 5,
  kPreempt = 6,
  kFinish = 7,
  kAbort = 8,
  kReject = 9,
  kStep = 10,
  kPrefixHit = 11,
  kCache = 12,
  kEvict = 13,
  kCacheReset = 14,
  // KV offload transfers (engine/offload; v1_offload_passes.hpp)
  kOffloadLoad = 15,
  kOffloadStore = 16,
  kOffloadLoadDone = 17,
  kOffloadStoreDone = 18,
  kFirstToken = 19,
};
constexpr int32_t kNoSeq = -1;  // seq_id of events about no sequence (EVICT, STEP, ...)

// A growable array of trivially copyable values in one malloc'd block (so that it can be
// released to an owner that frees it with free()).
template <class T>
class Column {
  static_assert(std::is_trivially_copyable<T>::value, "columns hold plain values");

 public:
  Column() = default;
  Column(const Column&) = delete;
  Column& operator=(const Column&) = delete;
  ~Column() { std::free(data_); }

  size_t size() const { return size_; }
  const T* data() const { return data_; }
  T operator[](size_t i) const { return data_[i]; }

  void reserve(size_t capacity) {
    if (capacity <= capacity_) return;
    void* grown = std::realloc(data_, capacity * sizeof(T));
    if (grown == nullptr) throw std::bad_alloc();
    data_ = static_cast<T*>(grown);
    capacity_ = capacity;
  }

  void push_back(T value) {
    if (size_ == capacity_) reserve(capacity_ ? 2 * capacity_ : std::max<size_t>(1024, hint_));
    data_[size_++] = value;
  }

  void append(const T* values, size_t n) {
    if (size_ + n > capacity_) reserve(std::max({2 * capacity_, size_ + n, hint_}));
    for (size_t i = 0; i < n; ++i) data_[size_ + i] = values[i];
    size_ += n;
  }

  // The array (the caller frees it with free()); the column is empty afterwards. nullptr
  // when it holds nothing.
  T* release() {
    T* out = size_ ? data_ : nullptr;
    if (!size_) std::free(data_);
    hint_ = size_;
    data_ = nullptr;
    size_ = capacity_ = 0;
    return out;
  }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
  // The size last released: an empty column's first growth goes straight to it, as a run's
  // chunks are alike. Without it the block id and key columns (not reserved per chunk)
  // regrew by doubling after every release, each realloc copying (~2% of the
  // azure_llm_2023_conv block_size=1 run in perf).
  size_t hint_ = 0;
};

class EventBuffer {
 public:
  // ``capacity``: events to make room for up front (a run's expected chunk).
  explicit EventBuffer(size_t capacity = 0) { reserve(capacity); }

  void reserve(size_t capacity) {
    time_s.reserve(capacity);
    step.reserve(capacity);
    kind.reserve(capacity);
    seq_id.reserve(capacity);
    free_blocks.reserve(capacity);
    num_tokens.reserve(capacity);
    num_blocks.reserve(capacity);
  }

  // Stamp the events that follow with scheduler step ``step`` at ``time_s`` seconds.
  void begin_step(int32_t step_index, double time) {
    current_step_ = step_index;
    current_time_ = time;
  }

  // One event; ``free`` is the pool's free blocks after it.
  void record(EventKind k, int64_t seq, int32_t free, const int32_t* blocks, size_t n,
              int32_t tokens) {
    time_s.push_back(current_time_);
    step.push_back(current_step_);
    kind.push_back(k);
    seq_id.push_back(static_cast<int32_t>(seq));
    free_blocks.push_back(free);
    num_tokens.push_back(tokens);
    num_blocks.push_back(static_cast<int32_t>(n));
    if (n) block_ids.append(blocks, n);
  }

  // The keys of the CACHE / EVICT event just recorded, one per block, in order.
  void record_hashes(const int64_t* keys, size_t n) { block_hashes.append(keys, n); }

  size_t size() const { return kind.size(); }

  Column<double> time_s;
  Column<int32_t> step;
  Column<int8_t> kind;
  Column<int32_t> seq_id;
  Column<int32_t> free_blocks;
  Column<int32_t> num_tokens;
  Column<int32_t> num_blocks;
  Column<int32_t> block_ids;
  Column<int64_t> block_hashes;

 private:
  int32_t current_step_ = 0;
  double current_time_ = 0.0;
};

}  // namespace kvsim
