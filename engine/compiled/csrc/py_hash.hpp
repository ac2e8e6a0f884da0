// CPython's hashes of ints and tuples of ints, and splitmix64, bit for bit.
//
// The Python path keys prefix-cache blocks with Python's own ``hash`` of int tuples
// (engine/v1/prefix_keys.py): deterministic across runs, since ints and tuples are not
// salted. The compiled path must produce the very same 64-bit keys, or the hashes recorded
// in CACHE / EVICT events (a vLLM-style KV-event export) would differ between the two paths.
// The algorithms below follow CPython 3.8+ (Objects/longobject.c long_hash for ints and
// Objects/tupleobject.c for tuples, the xxHash-based one); tests/engine/test_compiled_pool.py
// checks them against ``hash`` on random and edge-case values.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvsim {
namespace pyhash {

// The Mersenne prime 2^61 - 1 that CPython reduces ints by on 64-bit builds.
constexpr uint64_t kModulus = (uint64_t{1} << 61) - 1;

// hash(v) for an int v in the int64 range. -1 is CPython's error marker, so it hashes to -2.
inline int64_t int_hash(int64_t v) {
  // The magnitude as unsigned: -INT64_MIN does not fit an int64, but does a uint64.
  const uint64_t magnitude = v < 0 ? uint64_t{0} - static_cast<uint64_t>(v)
                                   : static_cast<uint64_t>(v);
  int64_t h = static_cast<int64_t>(magnitude % kModulus);
  if (v < 0) h = -h;
  return h == -1 ? -2 : h;
}

// hash() of a tuple, fed one item's hash (a "lane") at a time.
class TupleHasher {
 public:
  // An item whose own hash is already known (a nested tuple's, or a reduced int's).
  void add_lane(int64_t lane) {
    acc_ += static_cast<uint64_t>(lane) * kPrime2;
    acc_ = (acc_ << 31) | (acc_ >> 33);
    acc_ *= kPrime1;
    ++length_;
  }
  void add_int(int64_t v) { add_lane(int_hash(v)); }

  int64_t finish() const {
    // CPython mixes the length in so that hash(()) keeps its historical value.
    const uint64_t acc = acc_ + (static_cast<uint64_t>(length_) ^ (kPrime5 ^ 3527539ULL));
    if (acc == ~uint64_t{0}) return 1546275796;  // -1 is reserved, as for ints
    return static_cast<int64_t>(acc);
  }

 private:
  static constexpr uint64_t kPrime1 = 11400714785074694791ULL;
  static constexpr uint64_t kPrime2 = 14029467366897019727ULL;
  static constexpr uint64_t kPrime5 = 2870177450012600261ULL;
  uint64_t acc_ = kPrime5;
  size_t length_ = 0;
};

// hash((a, b)) and hash((a, b, c)) of ints.
inline int64_t tuple_hash(int64_t a, int64_t b) {
  TupleHasher h;
  h.add_int(a);
  h.add_int(b);
  return h.finish();
}
inline int64_t tuple_hash(int64_t a, int64_t b, int64_t c) {
  TupleHasher h;
  h.add_int(a);
  h.add_int(b);
  h.add_int(c);
  return h.finish();
}

// hash(tuple(values[0:n])) of ints.
inline int64_t tuple_hash(const int64_t* values, size_t n) {
  TupleHasher h;
  for (size_t i = 0; i < n; ++i) h.add_int(values[i]);
  return h.finish();
}

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

// splitmix64's finaliser (with its golden-ratio increment), wrapping: prefix_keys.py's _mix.
inline uint64_t splitmix(uint64_t x) {
  x += kGolden;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace pyhash
}  // namespace kvsim
