// A bounded, seeded uniform sample of a metric's values, with their exact mean: the compiled
// mirror of kvsim/analysis/residency.py's SampleReservoir and ExactSum.
//
// Every value comes with an id that does not depend on batching (for a block life, the
// number of the event row that ended it). The reservoir keeps every value up to
// ``capacity``, then the ``capacity`` whose priorities are smallest (bottom-k), a value's
// priority being splitmix64's finalizer of ``id ^ seed``: which values are kept depends only
// on the set of ids, so the Python and compiled reservoirs, trimming at different moments,
// keep the same ones. The sum is exact: each value's 53-bit integer mantissa is added to a
// 128-bit integer per binary exponent (the Python ExactSum's dictionary), so the mean is the
// correctly rounded mean of every value however they were added.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

namespace kvsim {

// kvsim/analysis/residency.py's _priority
inline uint64_t sample_priority(int64_t id, uint64_t seed) {
  uint64_t z = static_cast<uint64_t>(id) ^ seed;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

class SampleReservoir {
 public:
  struct Sample {
    int64_t id;
    double value;
  };

  SampleReservoir(size_t capacity, uint64_t seed) : capacity_(capacity), seed_(seed) {}

  void add(double value, int64_t id) {
    ++count_;
    add_to_sum(value);
    if (has_threshold_ && sample_priority(id, seed_) >= threshold_) return;
    kept_.push_back({id, value});
    if (kept_.size() > capacity_ + capacity_ / 4) trim();  // bounded slack, rare trims
  }

  // The kept values in the order of their ids (every value added, or past ``capacity`` the
  // sample); trims first.
  const std::vector<Sample>& samples() {
    trim();
    std::sort(kept_.begin(), kept_.end(),
              [](const Sample& a, const Sample& b) { return a.id < b.id; });
    return kept_;
  }

  int64_t count() const { return count_; }

  // The exact sum as (k, high, low) per binary exponent k: the values sum to
  // Σ (high * 2**64 + low) * 2**k (high signed, low unsigned: a 128-bit integer in halves).
  void sum_parts(std::vector<int32_t>& exponents, std::vector<int64_t>& high,
                 std::vector<uint64_t>& low) const {
    for (const auto& [k, total] : sums_) {
      exponents.push_back(k);
      high.push_back(static_cast<int64_t>(total >> 64));
      low.push_back(static_cast<uint64_t>(total));
    }
  }

 private:
  // ExactSum.add for one value: frexp's mantissa times 2**53 is an exact integer.
  void add_to_sum(double value) {
    int exponent = 0;
    const double mantissa = std::frexp(value, &exponent);
    const int64_t m = static_cast<int64_t>(mantissa * 9007199254740992.0);  // 2**53
    if (m) sums_[exponent - 53] += m;
  }

  // SampleReservoir._trim: keep the ``capacity`` smallest priorities; the largest kept is
  // the threshold later values must beat.
  void trim() {
    if (kept_.size() <= capacity_) return;
    std::vector<std::pair<uint64_t, Sample>> ranked;
    ranked.reserve(kept_.size());
    for (const Sample& s : kept_) ranked.push_back({sample_priority(s.id, seed_), s});
    auto by_priority = [](const auto& a, const auto& b) { return a.first < b.first; };
    std::nth_element(ranked.begin(), ranked.begin() + std::ptrdiff_t(capacity_) - 1,
                     ranked.end(), by_priority);
    ranked.resize(capacity_);
    threshold_ = std::max_element(ranked.begin(), ranked.end(), by_priority)->first;
    has_threshold_ = true;
    kept_.clear();
    for (const auto& r : ranked) kept_.push_back(r.second);
  }

  size_t capacity_;
  uint64_t seed_;
  int64_t count_ = 0;
  std::vector<Sample> kept_;
  bool has_threshold_ = false;
  uint64_t threshold_ = 0;
  std::map<int, __int128> sums_;
};

}  // namespace kvsim
