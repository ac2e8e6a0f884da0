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
//
// A slot's key and head share one 16-byte Slot, and a block's two ring links one Link, so a
// probe or a ring update touches one cache line, not two: at small block sizes every decode
// token inserts a key and evicts one, scattered over a table of millions of slots.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace kvsim {

class PrefixIndex {
 public:
  explicit PrefixIndex(int32_t num_blocks)
      : ring_(size_t(num_blocks), Link{kNone, kNone}) {
    size_t capacity = 16;
    while (capacity < 2 * size_t(num_blocks)) capacity *= 2;
    slots_.assign(capacity, Slot{0, kNone, 0});
    mask_ = capacity - 1;
    shift_ = 64;
    for (size_t c = capacity; c > 1; c >>= 1) --shift_;
  }

  // The oldest block cached under ``key``, or -1.
  int32_t lookup(int64_t key) const {
    for (size_t i = home(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.head == kNone) return kNone;
      if (s.key == key) return s.head;
    }
  }

  // Cache ``key`` in block ``b`` too, after the blocks already holding it.
  void insert(int64_t key, int32_t b) {
    size_t i = home(key);
    for (; slots_[i].head != kNone; i = (i + 1) & mask_) {
      if (slots_[i].key == key) {  // a shared key: b joins the end of its ring
        const int32_t head = slots_[i].head, tail = ring_[size_t(head)].prev;
        ring_[size_t(tail)].next = b;
        ring_[size_t(b)].prev = tail;
        ring_[size_t(b)].next = head;
        ring_[size_t(head)].prev = b;
        return;
      }
    }
    slots_[i].key = key;
    slots_[i].head = b;
    ring_[size_t(b)].next = ring_[size_t(b)].prev = b;
    ++size_;
  }

  // Block ``b`` (cached under ``key``) leaves; the key's other blocks stay, in order.
  void erase(int64_t key, int32_t b) {
    size_t i = home(key);
    while (true) {
      if (slots_[i].head == kNone) throw std::logic_error("prefix-cache key is not in the map");
      if (slots_[i].key == key) break;
      i = (i + 1) & mask_;
    }
    const int32_t n = ring_[size_t(b)].next;
    if (n != b) {  // other blocks hold the key: unlink b from the ring
      const int32_t p = ring_[size_t(b)].prev;
      ring_[size_t(p)].next = n;
      ring_[size_t(n)].prev = p;
      if (slots_[i].head == b) slots_[i].head = n;
      ring_[size_t(b)].next = ring_[size_t(b)].prev = kNone;
      return;
    }
    ring_[size_t(b)].next = ring_[size_t(b)].prev = kNone;
    // Backward-shift deletion: pull later entries of the probe run into the hole, so
    // lookups never need tombstones.
    size_t hole = i;
    for (size_t j = (i + 1) & mask_; slots_[j].head != kNone; j = (j + 1) & mask_) {
      const size_t want = home(slots_[j].key);
      // Move j into the hole unless its home lies cyclically in (hole, j].
      const bool stays = hole <= j ? (hole < want && want <= j) : (hole < want || want <= j);
      if (stays) continue;
      slots_[hole] = slots_[j];
      hole = j;
    }
    slots_[hole].head = kNone;
    --size_;
  }

  // Distinct keys held.
  size_t size() const { return size_; }

  void clear() {
    for (Slot& s : slots_) s.head = kNone;
    ring_.assign(ring_.size(), Link{kNone, kNone});
    size_ = 0;
  }

 private:
  static constexpr int32_t kNone = -1;

  // Fibonacci hashing: keys of a unique prompt are an arithmetic sequence, which a plain
  // mask of their low bits would pile into a few runs.
  size_t home(int64_t key) const {
    return size_t((static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ULL) >> shift_) & mask_;
  }

  struct Slot {
    int64_t key;
    int32_t head;  // the key's oldest block; kNone: an empty slot
    int32_t pad;
  };
  struct Link {
    int32_t next, prev;
  };

  std::vector<Slot> slots_;
  std::vector<Link> ring_;  // per block: the ring of its key's blocks
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

}  // namespace kvsim
