// Hash maps and sets keyed by a chunk's int64 key, in one flat array: open addressing with
// linear probing, a power-of-two table at most three quarters full, backward-shift deletion
// (no tombstones). The CPU tier (offload_tier.hpp, offload_policies.hpp) looks keys up millions
// of times a run; std::unordered_map's node per entry and prime-modulo buckets were most of
// an offload run's time (Mooncake's first 1,000 requests: ~0.8 M chunks stored and evicted,
// ~4 us each). Nothing iterates these in an order that decides anything (every iteration
// feeds a set or a sorted list), so their order is free.
//
// Pointers into a map stay valid until the next insertion or erase.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace kvsim {

template <class V>
class FlatKeyMap {
 public:
  struct Slot {
    int64_t first = 0;  // the key (std::pair's names, so call sites read alike)
    V second{};
    bool used = false;
  };

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // The key's slot, nullptr if absent (``end()``).
  Slot* find(int64_t key) {
    if (size_ == 0) return nullptr;
    for (size_t i = home(key);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (!s.used) return nullptr;
      if (s.first == key) return &s;
    }
  }
  const Slot* find(int64_t key) const { return const_cast<FlatKeyMap*>(this)->find(key); }
  static constexpr Slot* end() { return nullptr; }
  size_t count(int64_t key) const { return find(key) != nullptr; }

  // Ask the cache for the key's home slot ahead of a find (the tier walks a request's chunk
  // keys in order: their slots are scattered over a table larger than the L2 cache).
  void prefetch(int64_t key) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[home(key)]);
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
    size_t i = home(key);
    for (; slots_[i].used; i = (i + 1) & mask_)
      if (slots_[i].first == key) return {&slots_[i], false};
    Slot& s = slots_[i];
    s.first = key;
    s.second = std::move(value);
    s.used = true;
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
    for (size_t j = (hole + 1) & mask_; slots_[j].used; j = (j + 1) & mask_) {
      const size_t want = home(slots_[j].first);
      // the entry at j may fill the hole unless its home lies cyclically in (hole, j]
      const bool stays = hole <= j ? (hole < want && want <= j) : (hole < want || want <= j);
      if (stays) continue;
      slots_[hole] = std::move(slots_[j]);
      hole = j;
    }
    slots_[hole].used = false;
    slots_[hole].second = V();
    --size_;
  }

  void clear() {
    slots_.clear();
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
    for (const Slot& s : slots_)
      if (s.used) f(s.first, s.second);
  }

 private:
  size_t home(int64_t key) const {
    // Fibonacci hashing: the keys are hashes already, but not all of their low bits vary
    uint64_t x = uint64_t(key) * 0x9E3779B97F4A7C15ull;
    return size_t(x ^ (x >> 29)) & mask_;
  }

  void grow(size_t at_least = 0) {
    std::vector<Slot> old = std::move(slots_);
    size_t capacity = old.empty() ? 16 : 2 * old.size();
    while (capacity < at_least) capacity *= 2;
    slots_ = std::vector<Slot>(capacity);
    mask_ = capacity - 1;
    size_ = 0;
    for (Slot& s : old)
      if (s.used) emplace(s.first, std::move(s.second));
  }

  std::vector<Slot> slots_;
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
