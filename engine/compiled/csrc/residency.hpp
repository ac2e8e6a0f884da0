// vLLM's KV block residency samples and the eviction count, from the compiled event records.
//
// The compiled mirror of kvsim/analysis/residency.py's ResidencyCollector (and of the
// eviction count of kvsim/analysis/block_states.py's BlockStateTracker), which the Python
// path computes from the events chunk by chunk with vectorised numpy. Here the events are read
// once, in order, as the core hands them out (V1Core.take_events), so a run's millions of
// block rows never reach Python for it: only the samples do.
//
// The rule (vLLM's KVCacheMetricsCollector, vllm/v1/core/kv_cache_metrics.py): a block's
// life starts when the free queue hands it out (an ALLOCATE or APPEND_BLOCK row); each prefix
// hit on it (a PREFIX_HIT row) is an access, of which it remembers the last kHistory; when the
// queue hands it out again the life ends and is reported: lifetime (since it was handed out),
// idle time (since its last access, or since it was handed out) and the gaps between the
// accesses it remembers. A CACHE_RESET drops every open life unreported. Rows are numbered in
// event order over the pop and hit rows alone; a life's sample id is the number of the row
// that ended it (a gap's: that number times kHistory plus the gap's index), as the Python
// collector numbers them, so that the reservoirs (sample_reservoir.hpp, the same bounded
// sample as Python's) keep the same samples. tests/engine/test_compiled_residency.py holds
// the two equal on random event streams and on compiled runs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "event_buffer.hpp"
#include "sample_reservoir.hpp"

namespace kvsim {

class ResidencyTracker {
 public:
  static constexpr int kHistory = 4;  // vLLM's BlockMetricsState.access_history maxlen
  static constexpr int32_t kAhead = 8;  // blocks prefetched ahead

  // ``capacity`` and ``seed``: each reservoir's (RESERVOIR_SIZE and _SEED in Python).
  ResidencyTracker(int32_t num_blocks, size_t capacity, uint64_t seed)
      : lifetime(capacity, seed),
        idle(capacity, seed),
        reuse_gap(capacity, seed),
        lives_(static_cast<size_t>(num_blocks)) {}

  // Account every event in ``ev`` (call before its columns are released).
  void consume(const EventBuffer& ev) {
    consume(ev.kind.data(), ev.num_blocks.data(), ev.time_s.data(), ev.block_ids.data(),
            ev.size());
  }

  // ``n`` events as EventRecorder's columns give them: kind, num_blocks and time_s per event,
  // and every event's block ids flattened in event order.
  void consume(const int8_t* kind, const int32_t* count, const double* time,
               const int32_t* blocks, size_t n) {
    size_t b = 0;
    for (size_t i = 0; i < n; ++i) {
      const int32_t k = kind[i], m = count[i];
      if (k == kAllocate || k == kAppendBlock) {
        // The free queue hands out blocks in LRU order, scattered over a large table: ask
        // for a life a few blocks ahead (block size 1, whole Azure conv: ~5% less CPU)
        for (int32_t j = 0; j < m; ++j) {
          if (j + kAhead < m) __builtin_prefetch(&lives_[size_t(blocks[b + j + kAhead])]);
          pop(blocks[b + j], time[i]);
        }
      } else if (k == kPrefixHit) {
        for (int32_t j = 0; j < m; ++j) hit(blocks[b + j], time[i]);
      } else if (k == kEvict) {
        num_evictions += m;
      } else if (k == kCacheReset) {
        for (Life& life : lives_) life.open = false;
      }
      b += static_cast<size_t>(m);
    }
  }

  // The samples of the lives ended so far (seconds), as ResidencyCollector's reservoirs.
  SampleReservoir lifetime;
  SampleReservoir idle;
  SampleReservoir reuse_gap;
  int64_t num_evictions = 0;  // blocks whose key left the cache by reuse (EVICT rows)

 private:
  struct Life {
    double birth = 0.0;
    double hits[kHistory] = {};  // ring: the last accesses, hits[num_hits % kHistory] next
    int64_t num_hits = 0;
    bool open = false;
  };

  void pop(int32_t block, double t) {
    const int64_t row = rows_++;
    Life& life = lives_[static_cast<size_t>(block)];
    if (life.open) {
      const int64_t kept = std::min<int64_t>(life.num_hits, kHistory);
      const int64_t first = life.num_hits - kept;  // the oldest remembered access
      const double last = kept ? life.hits[(life.num_hits - 1) % kHistory] : life.birth;
      lifetime.add(t - life.birth, row);
      idle.add(t - last, row);
      for (int64_t g = 1; g < kept; ++g) {
        reuse_gap.add(life.hits[(first + g) % kHistory] - life.hits[(first + g - 1) % kHistory],
                      row * kHistory + (g - 1));
      }
    }
    life.open = true;
    life.birth = t;
    life.num_hits = 0;
  }

  void hit(int32_t block, double t) {
    ++rows_;
    Life& life = lives_[static_cast<size_t>(block)];
    if (!life.open) return;  // no life to belong to (never handed out, or reset since)
    life.hits[life.num_hits % kHistory] = t;
    ++life.num_hits;
  }

  std::vector<Life> lives_;
  int64_t rows_ = 0;  // pop and hit rows seen: the next row's number
};

}  // namespace kvsim
