// A KV offload transfer job and what one scheduler step hands the worker (the compiled
// connector's, offload_connector.hpp; engine.core TransferJob and the connector's
// ConnectorMeta), and the room of finished jobs' columns kept for new ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_set>
#include <utility>
#include <vector>

namespace kvsim {

// A load (tier -> GPU) or store (GPU -> tier) of one request (engine.core TransferJob).
struct OffloadJob {
  int64_t job_id = 0;
  int64_t seq_id = 0;
  bool is_store = false;
  std::vector<int64_t> keys;           // the chunks it moves
  std::vector<int32_t> gpu_block_ids;  // the GPU blocks it reads or writes
};

// What one schedule() hands the worker (ConnectorMeta): job ids into OffloadConnector::job.
struct OffloadMeta {
  std::vector<int64_t> load_jobs;
  std::vector<int64_t> store_jobs;
  std::unordered_set<int64_t> jobs_to_flush;
  std::vector<int64_t> evicted_keys;
};

// Finished jobs' key and block columns, emptied, for the next jobs to fill: a job's keys and
// blocks were two fresh allocations each (whole Mooncake trace: ~0.6 M jobs), and malloc and
// free were ~5% of the offload run in perf; with this round's other cuts (lru_order.hpp's
// fresh queue, one-walk evictions) bench_offload.py's offload run went from CPU 3.4-3.5 to
// 3.3 s, malloc and free ~200 fewer perf samples of ~16 k (docs/offload.md, "Speed").
class JobRoom {
 public:
  // Empty ``done``, keeping its jobs' columns (up to kSpares of them).
  void recycle(std::vector<OffloadJob>& done) {
    for (OffloadJob& job : done) {
      if (keys_.size() >= kSpares) break;
      job.keys.clear();
      job.gpu_block_ids.clear();
      keys_.push_back(std::move(job.keys));
      blocks_.push_back(std::move(job.gpu_block_ids));
    }
    done.clear();
  }
  // ``job``'s columns (empty) take a kept room, if any.
  void reuse(OffloadJob& job) {
    if (keys_.empty()) return;
    job.keys.swap(keys_.back());
    job.gpu_block_ids.swap(blocks_.back());
    keys_.pop_back();
    blocks_.pop_back();
  }

 private:
  static constexpr size_t kSpares = 256;
  std::vector<std::vector<int64_t>> keys_;
  std::vector<std::vector<int32_t>> blocks_;
};

}  // namespace kvsim
