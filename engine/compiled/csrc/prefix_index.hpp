// The prefix cache's map: key -> the blocks cached under it, oldest first.
//
// vLLM does not deduplicate (block tables stay append-only), so one key may be cached in
// several blocks; a lookup takes the oldest still cached (prefix_cache.py's _map_insert,
// _unshare). The map holds each key's oldest block; the others follow it in a ring per key,
// linked through two arrays indexed by block id, so every operation is O(1).
//
// The map is open addressing with linear probing and backward-shift deletion, sized once:
// a block carries at most one key, so it never holds more than num_blocks keys, and a table
// of at least twice that many slots never needs to grow.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace kvsim {

class PrefixIndex {
 public:
  explicit PrefixIndex(int32_t num_blocks)
      : next_same_(size_t(num_blocks), kNone), prev_same_(size_t(num_blocks), kNone) {
    size_t capacity = 16;
    while (capacity < 2 * size_t(num_blocks)) capacity *= 2;
    keys_.assign(capacity, 0);
    heads_.assign(capacity, kNone);
    mask_ = capacity - 1;
    shift_ = 64;
    for (size_t c = capacity; c > 1; c >>= 1) --shift_;
  }

  // The oldest block cached under ``key``, or -1.
  int32_t lookup(int64_t key) const {
    for (size_t i = home(key);; i = (i + 1) & mask_) {
      if (heads_[i] == kNone) return kNone;
      if (keys_[i] == key) return heads_[i];
    }
  }

  // Cache ``key`` in block ``b`` too, after the blocks already holding it.
  void insert(int64_t key, int32_t b) {
    size_t i = home(key);
    for (; heads_[i] != kNone; i = (i + 1) & mask_) {
      if (keys_[i] == key) {  // a shared key: b joins the end of its ring
        const int32_t head = heads_[i], tail = prev_same_[size_t(head)];
        next_same_[size_t(tail)] = b;
        prev_same_[size_t(b)] = tail;
        next_same_[size_t(b)] = head;
        prev_same_[size_t(head)] = b;
        return;
      }
    }
    keys_[i] = key;
    heads_[i] = b;
    next_same_[size_t(b)] = prev_same_[size_t(b)] = b;
    ++size_;
  }

  // Block ``b`` (cached under ``key``) leaves; the key's other blocks stay, in order.
  void erase(int64_t key, int32_t b) {
    size_t i = home(key);
    while (true) {
      if (heads_[i] == kNone) throw std::logic_error("prefix-cache key is not in the map");
      if (keys_[i] == key) break;
      i = (i + 1) & mask_;
    }
    const int32_t n = next_same_[size_t(b)];
    if (n != b) {  // other blocks hold the key: unlink b from the ring
      const int32_t p = prev_same_[size_t(b)];
      next_same_[size_t(p)] = n;
      prev_same_[size_t(n)] = p;
      if (heads_[i] == b) heads_[i] = n;
      next_same_[size_t(b)] = prev_same_[size_t(b)] = kNone;
      return;
    }
    next_same_[size_t(b)] = prev_same_[size_t(b)] = kNone;
    // Backward-shift deletion: pull later entries of the probe run into the hole, so
    // lookups never need tombstones.
    size_t hole = i;
    for (size_t j = (i + 1) & mask_; heads_[j] != kNone; j = (j + 1) & mask_) {
      const size_t want = home(keys_[j]);
      // Move j into the hole unless its home lies cyclically in (hole, j].
      const bool stays = hole <= j ? (hole < want && want <= j) : (hole < want || want <= j);
      if (stays) continue;
      keys_[hole] = keys_[j];
      heads_[hole] = heads_[j];
      hole = j;
    }
    heads_[hole] = kNone;
    --size_;
  }

  // Distinct keys held.
  size_t size() const { return size_; }

  void clear() {
    heads_.assign(heads_.size(), kNone);
    next_same_.assign(next_same_.size(), kNone);
    prev_same_.assign(prev_same_.size(), kNone);
    size_ = 0;
  }

 private:
  static constexpr int32_t kNone = -1;

  // Fibonacci hashing: keys of a unique prompt are an arithmetic sequence, which a plain
  // mask of their low bits would pile into a few runs.
  size_t home(int64_t key) const {
    return size_t((static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ULL) >> shift_) & mask_;
  }

  std::vector<int64_t> keys_;
  std::vector<int32_t> heads_;  // the key's oldest block; kNone: an empty slot
  std::vector<int32_t> next_same_, prev_same_;  // per block: the ring of its key's blocks
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

}  // namespace kvsim
