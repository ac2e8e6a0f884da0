// A bounded, seeded uniform sample of a metric's values, with their exact mean: the compiled
// mirror of kvsim/analysis/residency.py's SampleReservoir and ExactSum.
//
// Every value comes with an id that does not depend on batching (for a block life, the
// number of the event row that ended it). The reservoir keeps every value up to
// ``capacity``, then the ``capacity`` whose priorities are smallest (bottom-k), a value's
// priority being splitmix64's finalizer of ``id ^ seed``: which values are kept depends only
// on the set of ids, so the Python and compiled reservoirs, trimming at different moments,
// keep the same ones. The sum is exact: each value's 53-bit integer mantissa is added to a
// 128-bit integer per binary exponent (the Python ExactSum's dictionary; 2**74 values of
// one exponent before it could overflow), so the mean is the
// correctly rounded mean of every value however they were added.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <array>
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
  // 16 bytes: a sample's priority is recomputed where a trim needs it (a hash of a few ns)
  // rather than kept, so that full reservoirs (a million-request run's three, at 1.5 x
  // capacity between trims) take 144 MB instead of 216.
  struct Sample {
    int64_t id;
    double value;
  };

  // The kept samples' room is reserved up front, to the trim point (virtual memory: only the
  // pages the samples fill are ever touched). Grown by doubling instead, the whole Azure
  // conversation trace's three reservoirs (1.5 M lives each) were copied at every doubling
  // and every discarded smaller buffer's pages faulted in too: `kvsim run` of that trace
  // 69 k -> 57 k page faults (medians of 5, A/B interleaved).
  SampleReservoir(size_t capacity, uint64_t seed) : capacity_(capacity), seed_(seed) {
    kept_.reserve(capacity_ + capacity_ / 2 + 1);
  }

  void add(double value, int64_t id) {
    ++count_;
    add_to_sum(value);
    if (has_threshold_ && sample_priority(id, seed_) >= threshold_) return;
    kept_.push_back({id, value});
    if (kept_.size() > capacity_ + capacity_ / 2) trim();  // bounded slack, rare trims
  }

  // The kept values in the order of their ids (every value added, or past ``capacity`` the
  // sample); trims first.
  const std::vector<Sample>& samples() {
    trim();
    auto by_id = [](const Sample& a, const Sample& b) { return a.id < b.id; };
    if (!std::is_sorted(kept_.begin(), kept_.end(), by_id))  // values come in id order
      std::sort(kept_.begin(), kept_.end(), by_id);
    return kept_;
  }

  int64_t count() const { return count_; }

  // Free the kept samples' memory once they have been taken (``samples``): a full reservoir
  // holds 48 MB. The reservoir is empty afterwards; its count and sum stay.
  void release() { std::vector<Sample>().swap(kept_); }

  // The exact sum as (k, high, low) per binary exponent k: the values sum to
  // Σ (high * 2**64 + low) * 2**k (high signed, low unsigned: a 128-bit integer in halves).
  void sum_parts(std::vector<int32_t>& exponents, std::vector<int64_t>& high,
                 std::vector<uint64_t>& low) const {
    for (size_t i = 0; i < sums_.size(); ++i) {
      if (!sums_[i]) continue;
      const __int128 total = sums_[i];
      exponents.push_back(int32_t(i) + kMinExponent);
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
    if (m) sums_[size_t(exponent - 53 - kMinExponent)] += m;
  }

  // frexp's exponents of finite doubles lie in [-1073, 1024]: k = exponent - 53 indexes a flat
  // table (a std::map lookup per value was a fifth of a block-size-1 run's residency time).
  static constexpr int kMinExponent = -1073 - 53;
  static constexpr size_t kNumExponents = 1024 - 53 - kMinExponent + 1;

  // SampleReservoir._trim: keep the ``capacity`` smallest priorities; the largest kept is
  // the threshold later values must beat. (Python trims past 1.25 x capacity; trimming
  // later, past 1.5 x, keeps the same sample with half the trims: a block-size-1 run ends
  // tens of millions of lives.)
  void trim() {
    if (kept_.size() <= capacity_) return;
    const uint64_t seed = seed_;
    auto by_priority = [seed](const Sample& a, const Sample& b) {
      return sample_priority(a.id, seed) < sample_priority(b.id, seed);
    };
    const auto last = kept_.begin() + std::ptrdiff_t(capacity_) - 1;
    std::nth_element(kept_.begin(), last, kept_.end(), by_priority);
    threshold_ = sample_priority(last->id, seed);  // nth_element: nothing before it is larger
    has_threshold_ = true;
    kept_.resize(capacity_);
  }

  size_t capacity_;
  uint64_t seed_;
  int64_t count_ = 0;
  std::vector<Sample> kept_;
  bool has_threshold_ = false;
  uint64_t threshold_ = 0;
  std::array<__int128, kNumExponents> sums_{};
};

}  // namespace kvsim
