// The scheduler side of KV offloading over the compiled CPU tier: a mirror of
// engine/offload/connector.py's OffloadConnector (vLLM 0.33's OffloadingConnectorScheduler)
// without secondary tiers, whose docstrings are the specification; each method names the one
// it mirrors. Requests are the scheduler's pool handles while they live; the connector keeps
// what it needs of a finished request (its chunk keys, the blocks it saw, its token counts)
// under its seq_id until its last transfer completes, as the Python connector keeps the
// Sequence. tests/engine/test_compiled_offload_core.py holds it (with the scheduler rules of
// v1_offload_passes.hpp) equal to the Python connector step by step.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "block_pool.hpp"
#include "offload_job.hpp"
#include "offload_tier.hpp"

namespace kvsim {

class OffloadConnector {
 public:
  // OffloadConfig(num_chunks, blocks_per_chunk, policy, offload_prompt_only), no secondary
  // tiers; ``prefix_caching``: the GPU pool caches prefixes.
  OffloadConnector(int64_t num_chunks, int32_t blocks_per_chunk, bool arc, bool prompt_only,
                   int32_t block_size, bool prefix_caching)
      : tier(num_chunks, arc),
        bpc_(blocks_per_chunk),
        bs_(block_size),
        tpc_(block_size * blocks_per_chunk),
        prompt_only_(prompt_only),
        track_loading_(prefix_caching) {
    if (blocks_per_chunk < 1) throw std::invalid_argument("blocks_per_chunk must be >= 1");
  }

  CpuTier tier;
  int64_t num_loaded_chunks = 0;
  int64_t num_stored_chunks = 0;

  // on_new_request
  void on_new_request(int64_t seq_id, int32_t num_prompt_tokens) {
    State& st = states_[seq_id];
    st = State();
    st.num_prompt_tokens = num_prompt_tokens;
  }

  // has_pending_work
  bool has_pending_work() const { return !jobs_.empty() || !finished_since_meta_.empty(); }

  // get_num_new_matched_tokens: -1 for None (ask again next step).
  int32_t get_num_new_matched_tokens(BlockPool& pool, int32_t h, int64_t seq_id,
                                     int32_t num_tokens, int32_t num_local_tokens) {
    State& st = state(seq_id);
    st.block_ids.clear();
    st.next_stored_chunk = 0;
    if (!st.transfer_jobs.empty()) return -1;
    update_offload_keys(st, pool, h, seq_id, num_tokens);
    st.num_local_tokens = num_local_tokens;
    const std::vector<int64_t>& keys = st.offload_keys;
    const int64_t num_keys = int64_t(keys.size());
    int64_t max_hit = std::min<int64_t>(num_tokens, num_keys * tpc_);
    if (max_hit - num_local_tokens < tpc_) return 0;
    const int64_t start = num_local_tokens / tpc_;
    const int64_t end = std::min(ceil_div(max_hit, tpc_), num_keys);
    int64_t num_hit_chunks = 0;
    bool pending = false;
    for (int64_t i = start; i < end; ++i) {
      if (i + 4 < end) tier.prefetch(keys[size_t(i + 4)]);
      const TierLookup result = tier.lookup(keys[size_t(i)]);
      if (result == kTierMiss) break;
      ++num_hit_chunks;
      pending |= result == kTierHitPending;
    }
    if (num_hit_chunks == 0) return 0;
    if (!pending) max_hit = std::min(max_hit, tpc_ * (start + num_hit_chunks));
    const int64_t num_hit_tokens = max_hit - num_local_tokens;
    if (num_hit_tokens < tpc_) return 0;
    if (pending) return -1;
    if (track_loading_ && !being_loaded_.empty()) {
      const int64_t stop = ceil_div(num_local_tokens + num_hit_tokens, tpc_);
      for (int64_t i = start; i < stop; ++i)
        if (being_loaded_.count(keys[size_t(i)])) return -1;
    }
    return int32_t(num_hit_tokens);
  }

  // update_state_after_alloc: ``table`` is the request's block table after allocation.
  void update_state_after_alloc(int64_t seq_id, const std::vector<int32_t>& table,
                                int32_t num_external_tokens) {
    allocate(table.begin(), table.end());
    if (num_external_tokens == 0) return;
    State& st = state(seq_id);
    const int64_t num_cached = int64_t(st.num_local_tokens) + num_external_tokens;
    const int64_t num_gpu_blocks = ceil_div(num_cached, bs_);
    const int64_t first_block = ceil_div(st.num_local_tokens, bs_);
    const int64_t num_chunks = ceil_div(num_cached, tpc_);
    OffloadJob job;
    room_.reuse(job);
    job.job_id = next_job_id_++;
    job.seq_id = seq_id;
    job.is_store = false;
    job.keys.assign(st.offload_keys.begin() + first_block / bpc_,
                    st.offload_keys.begin() + num_chunks);
    job.gpu_block_ids.assign(table.begin() + first_block, table.begin() + num_gpu_blocks);
    st.next_stored_chunk = num_chunks;
    tier.prepare_load_at(seq_id, size_t(first_block / bpc_), job.keys.size());
    batch_loads_.push_back(job.job_id);
    st.transfer_jobs.push_back(job.job_id);
    num_loaded_chunks += int64_t(job.keys.size());
    if (track_loading_) being_loaded_.insert(job.keys.begin(), job.keys.end());
    jobs_.emplace(job.job_id, std::move(job));
  }

  // build_meta. ``scheduled`` / ``num_new_tokens``: the step's batch as (handle, seq_id,
  // cached tokens, tokens) rows; ``admitted``: seq ids admitted this step; ``preempted``:
  // seq ids preempted this step.
  struct Scheduled {
    int32_t handle;
    int64_t seq_id;
    int32_t cached;
    int32_t num_tokens;
    int32_t num_new_tokens;
  };
  const OffloadMeta& build_meta(BlockPool& pool, const std::vector<Scheduled>& scheduled,
                                const std::vector<int64_t>& admitted,
                                const std::vector<int64_t>& preempted) {
    meta_.store_jobs.clear();
    meta_.jobs_to_flush.clear();
    // (each scheduled request's state looked up once: a decode step schedules hundreds, and
    // the second walk's look-ups were a third of build_meta's time in perf)
    scheduled_states_.clear();
    for (const Scheduled& s : scheduled) {
      State& st = state(s.seq_id);
      scheduled_states_.push_back(&st);
      if (st.next_stored_chunk < max_chunks(st, s.num_tokens))
        update_offload_keys(st, pool, s.handle, s.seq_id, s.num_tokens);
      const std::vector<int32_t>& table = pool.get(s.handle).table;
      if (std::find(admitted.begin(), admitted.end(), s.seq_id) != admitted.end()) {
        st.block_ids = table;
        allocate(table.begin(), table.end());
      } else if (table.size() > st.block_ids.size()) {
        const auto first = table.begin() + std::ptrdiff_t(st.block_ids.size());
        st.block_ids.insert(st.block_ids.end(), first, table.end());
        allocate(first, table.end());
      }
    }
    std::unordered_set<int64_t>& flush = meta_.jobs_to_flush;
    for (const int64_t seq_id : preempted) {
      const auto found = states_.find(seq_id);
      if (found == states_.end()) continue;
      for (const int64_t j : found->second.transfer_jobs)
        if (std::find(batch_loads_.begin(), batch_loads_.end(), j) == batch_loads_.end())
          flush.insert(j);
    }
    if (!block_pending_jobs_.empty()) {
      for (const int32_t b : batch_allocated_) {
        const auto found = block_pending_jobs_.find(b);
        if (found != block_pending_jobs_.end())
          flush.insert(found->second.begin(), found->second.end());
      }
    }
    finished_.clear();
    for (const int64_t seq_id : finished_since_meta_)
      if (states_.count(seq_id)) finished_.push_back(seq_id);
    work_.clear();
    for (size_t k = 0; k < scheduled.size(); ++k) {
      const Scheduled& s = scheduled[k];
      const State& st = *scheduled_states_[k];  // (no erase since: states_' nodes stay put)
      if (st.next_stored_chunk < max_chunks(st, s.num_tokens)) work_.push_back(s);
    }
    for (const int64_t seq_id : finished_) work_.push_back(Scheduled{-1, seq_id, 0, 0, 0});
    for (const Scheduled& s : work_) {
      State& st = state(s.seq_id);
      const int64_t job_id = store_job(st, s);
      if (job_id < 0) continue;
      meta_.store_jobs.push_back(job_id);
      if (st.finished) {
        for (const int32_t b : jobs_.at(job_id).gpu_block_ids) {
          block_pending_jobs_[b].insert(job_id);
          if (allocated(b)) flush.insert(job_id);
        }
      }
    }
    for (const int64_t seq_id : finished_) {
      State& st = state(seq_id);
      st.signaled = true;
      tier.on_request_finished(seq_id);
      if (st.transfer_jobs.empty()) states_.erase(seq_id);
    }
    meta_.load_jobs.swap(batch_loads_);
    batch_loads_.clear();
    meta_.evicted_keys.swap(batch_evicted_);
    batch_evicted_.clear();
    batch_allocated_.clear();
    ++batch_;  // every block's stamp is now of an older batch
    finished_since_meta_.clear();
    return meta_;
  }

  // request_finished: ``h`` still holds its blocks and keys (the scheduler calls this before
  // freeing them).
  void request_finished(BlockPool& pool, int32_t h, int64_t seq_id, int32_t num_tokens) {
    const auto found = states_.find(seq_id);
    if (found == states_.end()) return;
    State& st = found->second;
    update_offload_keys(st, pool, h, seq_id, num_tokens);
    st.finished = true;
    st.num_tokens_at_finish = num_tokens;
    for (const int64_t j : st.transfer_jobs) {
      const OffloadJob& job = jobs_.at(j);
      if (!job.is_store) continue;
      for (const int32_t b : job.gpu_block_ids) block_pending_jobs_[b].insert(j);
    }
    finished_since_meta_.push_back(seq_id);
  }

  // update_connector_output: the jobs reported done, in the order given; ``done`` receives
  // them (moved out of the connector).
  void update_connector_output(const std::vector<int64_t>& completed,
                               std::vector<OffloadJob>& done) {
    recycle(done);
    for (const int64_t job_id : completed) {
      const auto found = jobs_.find(job_id);
      if (found == jobs_.end())
        throw std::logic_error("job " + std::to_string(job_id) + " is not in flight");
      done.push_back(std::move(found->second));
      jobs_.erase(found);
      const OffloadJob& job = done.back();
      State& st = state(job.seq_id);
      if (job.is_store) {
        tier.complete_store(job.keys.data(), job.keys.size());
      } else {
        tier.complete_load(job.keys.data(), job.keys.size());
        if (!being_loaded_.empty())
          for (const int64_t key : job.keys) being_loaded_.erase(key);
      }
      if (!block_pending_jobs_.empty() && st.finished && job.is_store) {
        for (const int32_t b : job.gpu_block_ids) {
          const auto pending = block_pending_jobs_.find(b);
          if (pending == block_pending_jobs_.end()) continue;
          pending->second.erase(job_id);
          if (pending->second.empty()) block_pending_jobs_.erase(pending);
        }
      }
      st.transfer_jobs.erase(std::find(st.transfer_jobs.begin(), st.transfer_jobs.end(), job_id));
      if (st.signaled && st.transfer_jobs.empty()) states_.erase(job.seq_id);
    }
  }

  // Empty ``done`` (update_connector_output's last), its jobs' room kept (JobRoom).
  void recycle(std::vector<OffloadJob>& done) { room_.recycle(done); }

  // The last build_meta's output.
  const OffloadMeta& meta() const { return meta_; }
  // has_job
  bool has_job(int64_t job_id) const { return jobs_.count(job_id) != 0; }
  // A job in flight (built and not reported done).
  const OffloadJob& job(int64_t job_id) const { return jobs_.at(job_id); }
  size_t num_states() const { return states_.size(); }

 private:
  struct State {
    int32_t num_prompt_tokens = 0;
    int32_t num_tokens_at_finish = 0;
    std::vector<int64_t> offload_keys;
    std::vector<int32_t> block_ids;  // as the connector last saw the table
    int64_t next_stored_chunk = 0;
    int32_t num_local_tokens = 0;
    std::vector<int64_t> transfer_jobs;  // a set: a few at a time
    bool finished = false;
    bool signaled = false;
  };

  static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }


  // _batch_allocated.update(blocks)
  template <class It>
  void allocate(It first, It last) {
    for (; first != last; ++first) {
      const int32_t b = *first;
      if (size_t(b) >= allocated_in_.size()) allocated_in_.resize(size_t(b) + 1, 0);
      if (allocated_in_[size_t(b)] == batch_) continue;
      allocated_in_[size_t(b)] = batch_;
      batch_allocated_.push_back(b);
    }
  }
  bool allocated(int32_t b) const {
    return size_t(b) < allocated_in_.size() && allocated_in_[size_t(b)] == batch_;
  }

  State& state(int64_t seq_id) {
    const auto found = states_.find(seq_id);
    if (found == states_.end())
      throw std::logic_error("the connector does not know sequence " + std::to_string(seq_id));
    return found->second;
  }
  const State& state(int64_t seq_id) const {
    return const_cast<OffloadConnector*>(this)->state(seq_id);
  }

  // _update_offload_keys
  void update_offload_keys(State& st, BlockPool& pool, int32_t h, int64_t seq_id,
                           int32_t num_tokens) {
    const int64_t num_chunks = num_tokens / tpc_;
    std::vector<int64_t>& keys = st.offload_keys;
    if (int64_t(keys.size()) >= num_chunks) return;
    const std::vector<int64_t>& hashes = pool.block_keys(h, int32_t(num_chunks * bpc_));
    const int64_t first = int64_t(keys.size());
    for (int64_t i = first; i < num_chunks; ++i) keys.push_back(hashes[size_t((i + 1) * bpc_ - 1)]);
    tier.add_positions_at(seq_id, size_t(first), keys.data() + first, size_t(num_chunks - first),
                          (first + 1) * tpc_, tpc_);
  }

  // _max_chunks
  int64_t max_chunks(const State& st, int32_t num_tokens) const {
    return (prompt_only_ ? st.num_prompt_tokens : num_tokens) / tpc_;
  }

  // _store_job: the job's id, or -1 for none.
  int64_t store_job(State& st, const Scheduled& s) {
    int64_t num_tokens, computed_after;
    if (st.finished) {
      num_tokens = st.num_tokens_at_finish;
      computed_after = std::max<int64_t>(st.num_prompt_tokens, num_tokens - 1);
    } else {
      num_tokens = s.num_tokens;
      computed_after = int64_t(s.cached) + s.num_new_tokens;
    }
    int64_t offloadable = std::min(computed_after, num_tokens);
    if (prompt_only_) offloadable = std::min<int64_t>(offloadable, st.num_prompt_tokens);
    const int64_t num_chunks =
        std::min({offloadable / tpc_, int64_t(st.block_ids.size()) / bpc_,
                  int64_t(st.offload_keys.size())});
    const int64_t start = st.next_stored_chunk;
    if (num_chunks <= start) return -1;
    const int64_t* offered = st.offload_keys.data() + start;
    const size_t num_offered = size_t(num_chunks - start);
    if (!tier.prepare_store_at(s.seq_id, size_t(start), num_offered, to_store_, evicted_))
      return -1;
    st.next_stored_chunk = num_chunks;
    batch_evicted_.insert(batch_evicted_.end(), evicted_.begin(), evicted_.end());
    if (to_store_.empty()) return -1;
    OffloadJob job;
    room_.reuse(job);
    job.job_id = next_job_id_++;
    job.seq_id = s.seq_id;
    job.is_store = true;
    job.keys.assign(to_store_.begin(), to_store_.end());
    job.gpu_block_ids.reserve(to_store_.size() * size_t(bpc_));
    // to_store is the offered keys the tier did not hold, in their order: walk both
    size_t next = 0;
    for (size_t i = 0; i < num_offered && next < to_store_.size(); ++i) {
      if (offered[i] != to_store_[next]) continue;
      ++next;
      const auto first = st.block_ids.begin() + std::ptrdiff_t((int64_t(i) + start) * bpc_);
      job.gpu_block_ids.insert(job.gpu_block_ids.end(), first, first + bpc_);
    }
    st.transfer_jobs.push_back(job.job_id);
    num_stored_chunks += int64_t(job.keys.size());
    const int64_t id = job.job_id;
    jobs_.emplace(id, std::move(job));
    return id;
  }

  int64_t bpc_, bs_, tpc_;
  bool prompt_only_;
  bool track_loading_;  // _chunks_being_loaded is not None (GPU prefix caching)
  std::unordered_map<int64_t, State> states_;  // by seq_id
  std::unordered_map<int64_t, OffloadJob> jobs_;  // in flight
  int64_t next_job_id_ = 0;
  std::unordered_set<int64_t> being_loaded_;
  std::unordered_map<int32_t, std::unordered_set<int64_t>> block_pending_jobs_;
  std::vector<int64_t> batch_loads_;
  // _batch_allocated: the blocks allocated in this batch, each once (a block is in it when its
  // stamp is the batch's number)
  std::vector<int32_t> batch_allocated_;
  std::vector<uint32_t> allocated_in_;  // by block id: the batch that last allocated it
  uint32_t batch_ = 1;
  std::vector<int64_t> batch_evicted_;
  std::vector<int64_t> finished_since_meta_;
  OffloadMeta meta_;
  std::vector<int64_t> finished_, to_store_, evicted_;
  std::vector<Scheduled> work_;
  std::vector<State*> scheduled_states_;  // build_meta's
  JobRoom room_;  // finished jobs' columns, for new ones
};

}  // namespace kvsim
