// Hash maps and sets keyed by a chunk's int64 key, in one flat array: open addressing with
// linear probing, a power-of-two table at most three quarters full, backward-shift deletion
// (no tombstones), and a control byte per slot beside the slots (see tag()), read 16 at a
// time (see Group). The CPU tier
// (offload_tier.hpp, offload_policies.hpp) looks keys up millions of times a run;
// std::unordered_map's node per entry and prime-modulo buckets were most of an offload run's
// time (Mooncake's first 1,000 requests: ~0.8 M chunks stored and evicted, ~4 us each).
// Nothing iterates these in an order that decides anything (every iteration feeds a set or a
// sorted list), so their order is free.
//
// Pointers into a map stay valid until the next insertion or erase.
#pragma once

#include <sys/mman.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <cstdint>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <memory>
#include <vector>

namespace kvsim {

// std::allocator, except that an array of 1 MiB or more sits on 2 MiB pages where the kernel
// gives them (transparent huge pages on request): a table looked up at random keys then costs
// no TLB miss per look-up (the offload tier's chunk map, 1.5 MiB; whole Mooncake trace, three
// runs alternating: the offload run's CPU 3.68-4.02 -> 3.50-3.79 s).
template <class T>
struct HugePageAllocator {
  using value_type = T;
  static constexpr size_t kHuge = size_t(2) << 20;
  static constexpr size_t kLarge = size_t(1) << 20;  // from this size on
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) {}
  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kLarge) return std::allocator<T>().allocate(n);
    void* p = nullptr;
    if (posix_memalign(&p, kHuge, (bytes + kHuge - 1) / kHuge * kHuge) != 0) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    madvise(p, (bytes + kHuge - 1) / kHuge * kHuge, MADV_HUGEPAGE);
#endif
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) {
    if (n * sizeof(T) < kLarge) {
      std::allocator<T>().deallocate(p, n);
    } else {
      free(p);
    }
  }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const HugePageAllocator<U>&) const { return false; }
};

template <class V>
class FlatKeyMap {
 public:
  struct Slot {
    int64_t first = 0;  // the key (std::pair's names, so call sites read alike)
    V second{};
  };

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // The key's slot, nullptr if absent (``end()``).
  Slot* find(int64_t key) {
    if (size_ == 0) return nullptr;
    const uint64_t x = mix(key);
    const uint8_t t = tag(x);
    for (size_t i = size_t(x ^ (x >> 29)) & mask_;; i = (i + kGroup) & mask_) {
      const Group g = group(i, t);
      // the probe runs to the first empty slot: the tag matches before it are the candidates
      for (uint32_t m = g.match & g.before_empty(); m != 0; m &= m - 1) {
        Slot& s = slots_[(i + size_t(__builtin_ctz(m))) & mask_];
        if (s.first == key) return &s;
      }
      if (g.empty != 0) return nullptr;
    }
  }
  const Slot* find(int64_t key) const { return const_cast<FlatKeyMap*>(this)->find(key); }
  // find() for a key that is most likely held (an eviction's candidate): the walk a byte at
  // a time, whose first step finds most held keys at their home
  Slot* find_held(int64_t key) {
    if (size_ == 0) return nullptr;
    const uint64_t x = mix(key);
    const uint8_t t = tag(x);
    for (size_t i = size_t(x ^ (x >> 29)) & mask_;; i = (i + 1) & mask_) {
      const uint8_t c = ctrl_[i];
      if (c == 0) return nullptr;
      if (c == t && slots_[i].first == key) return &slots_[i];
    }
  }
  static constexpr Slot* end() { return nullptr; }
  size_t count(int64_t key) const { return find(key) != nullptr; }
  // Whether ``s`` (a slot find() gave) still holds ``key`` (an erase may have moved it).
  bool holds(const Slot* s, int64_t key) const {
    return ctrl_[size_t(s - slots_.data())] != 0 && s->first == key;
  }

  // Ask the cache for the key's home slot ahead of a find (the tier walks a request's chunk
  // keys in order: their slots are scattered over a table larger than the L2 cache).
  void prefetch(int64_t key) const {
    if (slots_.empty()) return;
    const size_t i = home(key);
    __builtin_prefetch(&ctrl_[i]);
    __builtin_prefetch(&ctrl_[i + kGroup - 1]);  // (find reads kGroup bytes: maybe two lines)
    __builtin_prefetch(&slots_[i]);
  }

  V& at(int64_t key) {
    Slot* s = find(key);
    if (s == nullptr) throw std::out_of_range("key " + std::to_string(key) + " is not held");
    return s->second;
  }
  const V& at(int64_t key) const { return const_cast<FlatKeyMap*>(this)->at(key); }

  // The key's value, inserted default-constructed if absent.
  V& operator[](int64_t key) { return emplace(key, V()).first->second; }

  // Insert (key, value) unless the key is held; (its slot, whether inserted).
  std::pair<Slot*, bool> emplace(int64_t key, V value) {
    if (4 * (size_ + 1) > 3 * slots_.size()) grow();
    const uint64_t x = mix(key);
    const uint8_t t = tag(x);
    size_t i = size_t(x ^ (x >> 29)) & mask_;
    for (;; i = (i + kGroup) & mask_) {  // find()'s walk; the key goes in the first empty slot
      const Group g = group(i, t);
      for (uint32_t m = g.match & g.before_empty(); m != 0; m &= m - 1) {
        Slot& s = slots_[(i + size_t(__builtin_ctz(m))) & mask_];
        if (s.first == key) return {&s, false};
      }
      if (g.empty != 0) {
        i = (i + size_t(__builtin_ctz(g.empty))) & mask_;
        break;
      }
    }
    Slot& s = slots_[i];
    set_ctrl(i, t);
    s.first = key;
    s.second = std::move(value);
    ++size_;
    return {&s, true};
  }

  bool erase(int64_t key) {
    Slot* s = find(key);
    if (s == nullptr) return false;
    erase(s);
    return true;
  }

  // Backward-shift deletion: the entries after the hole that may move into it do.
  void erase(Slot* s) {
    size_t hole = size_t(s - slots_.data());
    for (size_t j = (hole + 1) & mask_; ctrl_[j] != 0; j = (j + 1) & mask_) {
      const size_t want = home(slots_[j].first);
      // the entry at j may fill the hole unless its home lies cyclically in (hole, j]
      const bool stays = hole <= j ? (hole < want && want <= j) : (hole < want || want <= j);
      if (stays) continue;
      slots_[hole] = std::move(slots_[j]);
      set_ctrl(hole, ctrl_[j]);
      hole = j;
    }
    set_ctrl(hole, 0);
    slots_[hole].second = V();
    --size_;
  }

  void clear() {
    slots_.clear();
    ctrl_.clear();
    mask_ = 0;
    size_ = 0;
  }

  // Room for ``n`` entries without growing again.
  void reserve(size_t n) {
    if (4 * n > 3 * slots_.size()) grow((4 * n + 2) / 3);
  }

  // f(key, value) for every entry, in table order.
  template <class F>
  void for_each(F&& f) const {
    for (size_t i = 0; i < slots_.size(); ++i)
      if (ctrl_[i] != 0) f(slots_[i].first, slots_[i].second);
  }

 private:
  // Fibonacci hashing: the keys are hashes already, but not all of their low bits vary
  static uint64_t mix(int64_t key) { return uint64_t(key) * 0x9E3779B97F4A7C15ull; }
  size_t home(int64_t key) const {
    const uint64_t x = mix(key);
    return size_t(x ^ (x >> 29)) & mask_;
  }
  // A slot's control byte: 0 empty, else 8 bits of its key's hash (other bits than the
  // home's), so that a look-up for an absent key reads the byte array alone (64 KiB for a
  // 32,768-chunk tier) and not the slots (1.5 MiB): most of the tier's look-ups miss (a
  // store's offered chunks, a finished request's evicted ones). Whole Mooncake trace, perf,
  // one run each: the store walk 211 -> 162 samples, the tier 1006 -> 977.
  static uint8_t tag(uint64_t x) {
    const uint8_t t = uint8_t(x >> 56);
    return t == 0 ? 1 : t;
  }

  // find() and emplace() read the control bytes kGroup at a time: the slots from i on whose
  // tag is ``t`` (bit k: slot i + k) and the empty ones, as SwissTable's groups do (the same
  // linear probe, the same slots: only the walk changed). A look-up then takes a key compare
  // per tag match before the first empty slot, and nearly always one branch outcome, where
  // the byte-at-a-time walk took a branch per slot, mispredicted wherever an absent key's
  // home was taken or a key sat a slot past its home: at a load of about half, often. Whole
  // Mooncake trace, 64 GiB tier, perf in turns with the byte walk (3 rounds): the tier's
  // samples -25% (store walk 720 -> 410, completed stores 510 -> 240, finish re-rank 380 ->
  // 140; evictions, bound by their slots' misses, alike). The control array holds kGroup more
  // bytes, copies of its first kGroup, so that a group read past the end wraps.
  static constexpr size_t kGroup = 16;
  struct Group {
    uint32_t match;  // slots whose tag is t
    uint32_t empty;  // empty slots
    // the slots before the first empty one (all kGroup when none is empty)
    uint32_t before_empty() const { return empty == 0 ? 0xFFFFu : (empty & (0u - empty)) - 1; }
  };
  Group group(size_t i, uint8_t t) const {
#if defined(__SSE2__)
    const __m128i g = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ctrl_.data() + i));
    return {uint32_t(_mm_movemask_epi8(_mm_cmpeq_epi8(g, _mm_set1_epi8(char(t))))),
            uint32_t(_mm_movemask_epi8(_mm_cmpeq_epi8(g, _mm_setzero_si128())))};
#else
    Group out{0, 0};
    for (size_t k = 0; k < kGroup; ++k) {
      out.match |= uint32_t(ctrl_[i + k] == t) << k;
      out.empty |= uint32_t(ctrl_[i + k] == 0) << k;
    }
    return out;
#endif
  }
  void set_ctrl(size_t i, uint8_t c) {
    ctrl_[i] = c;
    if (i < kGroup) ctrl_[slots_.size() + i] = c;  // its copy past the end
  }

  void grow(size_t at_least = 0) {
    Slots old = std::move(slots_);
    std::vector<uint8_t> old_ctrl = std::move(ctrl_);
    size_t capacity = old.empty() ? 16 : 2 * old.size();
    while (capacity < at_least) capacity *= 2;
    slots_ = Slots(capacity);
    ctrl_.assign(capacity + kGroup, 0);
    mask_ = capacity - 1;
    size_ = 0;
    for (size_t i = 0; i < old.size(); ++i)
      if (old_ctrl[i] != 0) emplace(old[i].first, std::move(old[i].second));
  }

  using Slots = std::vector<Slot, HugePageAllocator<Slot>>;
  Slots slots_;
  std::vector<uint8_t> ctrl_;  // per slot: 0 empty, else tag(); then copies of the first kGroup
  size_t mask_ = 0;
  size_t size_ = 0;
};

// A set of keys (FlatKeyMap without values).
class FlatKeySet {
 public:
  FlatKeySet() = default;
  template <class It>
  FlatKeySet(It first, It last) {
    insert(first, last);
  }
  size_t size() const { return map_.size(); }
  bool empty() const { return map_.empty(); }
  size_t count(int64_t key) const { return map_.count(key); }
  bool insert(int64_t key) { return map_.emplace(key, Empty()).second; }
  template <class It>
  void insert(It first, It last) {
    map_.reserve(map_.size() + size_t(last - first));
    for (; first != last; ++first) insert(*first);
  }
  bool erase(int64_t key) { return map_.erase(key); }
  void clear() { map_.clear(); }
  void reserve(size_t n) { map_.reserve(n); }
  template <class F>
  void for_each(F&& f) const {
    map_.for_each([&](int64_t key, const Empty&) { f(key); });
  }

 private:
  struct Empty {};
  FlatKeyMap<Empty> map_;
};

}  // namespace kvsim
