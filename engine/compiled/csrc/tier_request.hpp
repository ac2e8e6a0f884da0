// What the CPU tier remembers about one request (engine/offload/policies.py's RequestContext,
// vLLM's ReqContext), as one record per chunk key instead of a dict and four sets keyed by
// chunk: the key, its position (tokens up to its chunk's end) and the request's marks
// (seen, inserted, reused, store miss) side by side in arrays, plus the first-seen order.
//
// Two ways to address a record:
// - keyed (the Python binding, CpuTier's key interface): a map key -> record, a record made
//   the first time a key is named (without a position unless add_positions gave one);
// - indexed (the compiled connector, offload_connector.hpp): record i is the request's i-th
//   offload chunk key, the connector naming chunks by their index in its key list. No hashing
//   at all per chunk: on the whole Mooncake conversation trace (8.6 M chunks stored) the map
//   and four sets per request were about a third of the tier's time in perf, and this took
//   the offload run's CPU from 5.2 to 4.6 s (bench_offload.py, medians of 3; docs/offload.md,
//   "Speed"). A request's chunk keys are chained prefix hashes, all different (a repeat
//   would be a 64-bit collision, which the GPU prefix cache already assumes away), so a
//   record per index is a record per key.
// A request is addressed one way only, the first call deciding.
#pragma once

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "flat_keys.hpp"

namespace kvsim {

using OffloadKey = int64_t;

constexpr int64_t kNoPosition = std::numeric_limits<int64_t>::min();

struct TierRequest {
  enum Mark : uint8_t { kSeen = 1, kInserted = 2, kReused = 4, kStoreMiss = 8 };
  enum Mode : int8_t { kUnset = 0, kKeyed = 1, kIndexed = 2 };

  std::vector<OffloadKey> keys;       // record -> its chunk key
  std::vector<int64_t> positions;     // record -> tokens up to its chunk's end, or kNoPosition
  std::vector<uint8_t> marks;         // record -> Mark bits
  std::vector<int32_t> seen_order;    // records, in first-seen order (seen_order)
  FlatKeyMap<int32_t> index;          // key -> record (keyed requests only)
  int64_t lru_rank = -1;              // -1: none yet
  bool finished = false;
  Mode mode = kUnset;

  // Empty again, keeping the arrays' room (records are recycled: a long prompt's arrays
  // would otherwise be mapped and zeroed afresh for every request).
  void reset() {
    keys.clear();
    positions.clear();
    marks.clear();
    seen_order.clear();
    index.clear();
    lru_rank = -1;
    finished = false;
    mode = kUnset;
  }

  void use(Mode m) {
    if (mode == kUnset) mode = m;
    if (mode != m)
      throw std::logic_error("a request's chunks are named by key or by index, not both");
  }

  int32_t size() const { return int32_t(keys.size()); }

  int32_t append(OffloadKey key, int64_t position) {
    keys.push_back(key);
    positions.push_back(position);
    marks.push_back(0);
    return int32_t(keys.size() - 1);
  }

  // keyed: the key's record, made (without a position) if the request never named it
  int32_t record_of(OffloadKey key) {
    const auto made = index.emplace(key, int32_t(keys.size()));
    if (made.second) append(key, kNoPosition);
    return made.first->second;
  }
};

}  // namespace kvsim
