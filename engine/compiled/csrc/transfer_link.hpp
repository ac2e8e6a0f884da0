// How long KV offload transfers take, compiled: a mirror of engine/offload/transfer.py's
// TransferLink (one tier's link, ``read`` and ``write`` directions, each processor-shared
// among its active jobs after a latency, or one job at a time in submission order). The
// Python module is the specification (its docstring gives the model and the arithmetic);
// every operation below is the same floating-point operation in the same order (the
// extension is built with -ffp-contract=off), so completion times are equal bit for bit.
// tests/engine/test_compiled_transfer.py drives both with the same jobs and polls.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <queue>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_set>
#include <utility>
#include <vector>

namespace kvsim {

// A completion: (time s, submission seq, job id).
struct LinkCompletion {
  double time;
  int64_t seq;
  int64_t job;
};

// _SharedDirection: a latency queue, then processor sharing of ``bandwidth``.
class SharedDirection {
 public:
  SharedDirection(double bandwidth, double latency) : bandwidth(bandwidth), latency(latency) {}

  void submit(int64_t seq, int64_t job, double nbytes, double now) {
    pending_.push(Pending{now + latency, seq, job, nbytes});
  }
  size_t in_flight() const { return pending_.size() + active_.size(); }
  size_t active() const { return active_.size(); }

  // next_completion: when the next job will finish (s), joins before it included; false if idle
  bool next_completion(double& out) const {
    double clock = clock_, service = service_;
    int64_t n = int64_t(active_.size());
    bool has_head = !active_.empty();
    double head = has_head ? active_.top().tag : 0.0;
    auto pending = pending_;  // sorted(self._pending): popped in (join, seq) order
    while (!pending.empty()) {
      const Pending p = pending.top();
      pending.pop();
      if (has_head) {
        const double finish = finish_at(clock, service, n, head);
        if (finish <= p.join) {
          out = finish;
          return true;
        }
      }
      service = service_at(clock, service, n, p.join);
      clock = p.join;
      ++n;
      if (service > kRebaseBytes) {  // as advance does, so the floats are the same
        if (has_head) head = head - service;
        service = 0.0;
      }
      const double tag = service + p.nbytes;
      head = has_head ? std::min(head, tag) : tag;
      has_head = true;
    }
    if (!has_head) return false;
    out = finish_at(clock, service, n, head);
    return true;
  }

  // advance: every join and completion up to ``now``, completions appended in order
  void advance(double now, std::vector<LinkCompletion>& done) {
    for (;;) {
      const double join = pending_.empty() ? std::numeric_limits<double>::infinity()
                                           : pending_.top().join;
      if (!active_.empty()) {
        const double tag = active_.top().tag;
        const double finish = finish_at(clock_, service_, int64_t(active_.size()), tag);
        // a completion at a join's instant goes first: the joiner takes none of its bytes
        if (finish <= now && finish <= join) {
          const Active a = active_.top();
          active_.pop();
          clock_ = finish;
          service_ = active_.empty() ? 0.0 : std::max(service_, tag);
          done.push_back({finish, a.seq, a.job});
          continue;
        }
      }
      if (join > now) return;
      const Pending p = pending_.top();
      pending_.pop();
      service_ = service_at(clock_, service_, int64_t(active_.size()), p.join);
      clock_ = p.join;
      if (service_ > kRebaseBytes) rebase();
      active_.push(Active{service_ + p.nbytes, p.seq, p.job});
    }
  }

  const double bandwidth;  // bytes/s
  const double latency;    // s

 private:
  static constexpr double kRebaseBytes = double(int64_t{1} << 40);  // transfer._REBASE_BYTES
  struct Pending {
    double join;
    int64_t seq;
    int64_t job;
    double nbytes;
    bool operator>(const Pending& o) const {
      return std::tie(join, seq) > std::tie(o.join, o.seq);
    }
  };
  struct Active {
    double tag;
    int64_t seq;
    int64_t job;
    bool operator>(const Active& o) const { return std::tie(tag, seq) > std::tie(o.tag, o.seq); }
  };

  double finish_at(double clock, double service, int64_t n, double tag) const {
    return clock + std::max(tag - service, 0.0) * double(n) / bandwidth;
  }
  double service_at(double clock, double service, int64_t n, double t) const {
    return n ? service + (t - clock) * bandwidth / double(n) : 0.0;
  }
  void rebase() {
    const double base = service_;
    std::vector<Active> all;
    while (!active_.empty()) {
      Active a = active_.top();
      active_.pop();
      a.tag -= base;
      all.push_back(a);
    }
    for (const Active& a : all) active_.push(a);
    service_ = 0.0;
  }

  std::priority_queue<Pending, std::vector<Pending>, std::greater<Pending>> pending_;
  std::priority_queue<Active, std::vector<Active>, std::greater<Active>> active_;
  double service_ = 0.0;  // bytes each active job has received, as of clock_
  double clock_ = 0.0;    // s: the last join or completion processed
};

// _FifoDirection: one job at a time in submission order, each starting at the later of its
// submission + latency and the previous job's end.
class FifoDirection {
 public:
  FifoDirection(double bandwidth, double latency) : bandwidth(bandwidth), latency(latency) {}

  void submit(int64_t seq, int64_t job, double nbytes, double now) {
    queue_.push_back({now + latency, seq, job, nbytes});
  }
  size_t in_flight() const { return queue_.size(); }
  size_t active() const { return std::min<size_t>(queue_.size(), 1); }

  bool next_completion(double& out) const {
    if (queue_.empty()) return false;
    const Job& j = queue_.front();
    out = std::max(j.join, free_at_) + j.nbytes / bandwidth;
    return true;
  }

  void advance(double now, std::vector<LinkCompletion>& done) {
    double finish;
    while (next_completion(finish) && finish <= now) {
      const Job j = queue_.front();
      queue_.pop_front();
      free_at_ = finish;
      done.push_back({finish, j.seq, j.job});
    }
  }

  const double bandwidth;
  const double latency;

 private:
  struct Job {
    double join;
    int64_t seq;
    int64_t job;
    double nbytes;
  };
  std::deque<Job> queue_;
  double free_at_ = 0.0;
};

// TransferLink: a tier's read (tier -> GPU) and write (GPU -> tier) directions. Direction
// 0 is read, 1 is write. Arguments are checked by the caller (the binding runs
// transfer.py's checks), except a job id already in flight and a time before the clock.
template <class Direction>
class TransferLinkOf {
 public:
  TransferLinkOf(double read_bytes_per_s, double write_bytes_per_s, double latency_s)
      : read_(read_bytes_per_s, latency_s), write_(write_bytes_per_s, latency_s) {}

  double now() const { return now_; }
  const Direction& direction(int d) const { return d == 0 ? read_ : write_; }
  size_t in_flight() const { return jobs_.size(); }

  void submit(int64_t job, int direction, double nbytes, double now) {
    check_time(now);
    if (jobs_.count(job))
      throw std::invalid_argument("job " + std::to_string(job) + " is already in flight");
    now_ = now;
    (direction == 0 ? read_ : write_).submit(seq_++, job, nbytes, now_);
    jobs_.insert(job);
    next_known_ = false;
  }

  // next_completion_time: false when nothing is in flight
  bool next_completion_time(double& out) {
    if (!next_known_) {
      double r, w;
      const bool has_r = read_.next_completion(r), has_w = write_.next_completion(w);
      has_next_ = has_r || has_w;
      next_ = has_r && has_w ? std::min(r, w) : (has_r ? r : w);
      next_known_ = true;
    }
    out = next_;
    return has_next_;
  }

  // advance_with_times: the completions by ``now`` in (time, submission) order
  const std::vector<LinkCompletion>& advance(double now) {
    check_time(now);
    now_ = now;
    done_.clear();
    read_.advance(now_, done_);
    write_.advance(now_, done_);
    if (done_.empty()) return done_;
    std::stable_sort(done_.begin(), done_.end(), [](const LinkCompletion& a, const LinkCompletion& b) {
      return a.time < b.time || (a.time == b.time && a.seq < b.seq);
    });
    for (const LinkCompletion& c : done_) jobs_.erase(c.job);
    next_known_ = false;
    return done_;
  }

 private:
  void check_time(double now) const {
    if (now < now_)
      throw std::invalid_argument("time " + std::to_string(now) + " is before the link's clock " +
                                  std::to_string(now_));
  }

  Direction read_, write_;
  double now_ = 0.0;
  int64_t seq_ = 0;
  std::unordered_set<int64_t> jobs_;  // in flight
  bool next_known_ = true, has_next_ = false;
  double next_ = 0.0;
  std::vector<LinkCompletion> done_;
};

using SharedLink = TransferLinkOf<SharedDirection>;
using FifoLink = TransferLinkOf<FifoDirection>;

}  // namespace kvsim
