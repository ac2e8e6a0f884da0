// Block hash keys of one request, exactly as engine/v1/prefix_keys.py and
// engine/v1/prefix_cache.py's ensure_block_hashes make them.
//
// A request's keys come from one of three sources (prefix_keys.py's module docstring):
// its token ids (chained tuple hashes of each block's tokens), a trace's hash ids
// (HashIdPrefix: splitmix of a chain of hash-id hashes), or nothing shared (UNIQUE_PREFIX:
// base + i * odd constant, salted by the seq_id). With a hash-id or unique source every
// generated token is the same placeholder, so the block the prompt ends in and every later
// one are keyed (parent key, GEN) in O(1) each.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "py_hash.hpp"

namespace kvsim {

// prefix_keys.py's tags, which keep the key families apart.
constexpr int64_t kTokenRoot = -0x6B7673696D00LL;
constexpr int64_t kHashIdRoot = -0x6B7673696D01LL;
constexpr int64_t kUniqueTag = -0x6B7673696D02LL;
constexpr int64_t kGenTag = -0x6B7673696D03LL;
constexpr int64_t kPromptEndTag = -0x6B7673696D04LL;

enum class SourceKind : int8_t { kTokens = 0, kHashIds = 1, kUnique = 2 };

// Where a request's block keys come from; ``salt`` is its seq_id.
class KeySource {
 public:
  // Keys from the token ids (the prompt's; generated ones are appended as they come).
  static KeySource tokens(int64_t salt, std::vector<int64_t> prompt) {
    KeySource s(SourceKind::kTokens, salt, static_cast<int32_t>(prompt.size()));
    s.tokens_ = std::move(prompt);
    return s;
  }

  // A trace's hash ids, one per ``hash_block_size`` prompt tokens (HashIdPrefix).
  static KeySource hash_ids(int64_t salt, int32_t num_prompt_tokens,
                            const std::vector<int64_t>& ids, int32_t hash_block_size) {
    if (hash_block_size < 1) throw std::invalid_argument("hash_block_size must be positive");
    KeySource s(SourceKind::kHashIds, salt, num_prompt_tokens);
    s.hash_block_size_ = hash_block_size;
    // Only the hash blocks holding prompt tokens matter.
    const int64_t covering = (int64_t{num_prompt_tokens} + hash_block_size - 1) / hash_block_size;
    const size_t used = static_cast<size_t>(std::min<int64_t>(int64_t(ids.size()), covering));
    int64_t parent = kHashIdRoot;
    for (size_t i = 0; i < used; ++i) {
      parent = pyhash::tuple_hash(parent, ids[i]);
      s.chain_.push_back(parent);
    }
    s.num_hashed_tokens_ = static_cast<int32_t>(
        std::min<int64_t>(int64_t(used) * hash_block_size, num_prompt_tokens));
    return s;
  }

  // A prompt nobody else shares (UNIQUE_PREFIX).
  static KeySource unique(int64_t salt, int32_t num_prompt_tokens) {
    return KeySource(SourceKind::kUnique, salt, num_prompt_tokens);
  }

  SourceKind kind() const { return kind_; }
  // Whether other requests may hold blocks under these keys (the map is searched); a
  // unique prompt's blocks are cached privately (prefix_cache.py's module docstring).
  bool shared() const { return kind_ != SourceKind::kUnique; }
  int32_t num_prompt_tokens() const { return num_prompt_tokens_; }
  int32_t num_tokens() const { return num_prompt_tokens_ + num_generated_; }

  // Generated tokens: their ids matter only to a token-keyed request.
  void append_tokens(const int64_t* ids, int32_t n) {
    if (kind_ == SourceKind::kTokens) tokens_.insert(tokens_.end(), ids, ids + n);
    num_generated_ += n;
  }

  // Extend ``keys`` (this request's keys of blocks 0 .. keys.size() - 1) to ``num_blocks``
  // keys. A token-keyed block must be full of known tokens.
  void extend_keys(std::vector<int64_t>& keys, int32_t num_blocks, int32_t block_size) const {
    size_t have = keys.size();
    if (have >= size_t(num_blocks)) return;
    // Grow geometrically, never to the exact size: a decode at block size 1 extends the keys
    // by one each step, and an exact reserve copied the whole vector every time (O(n^2) per
    // request; ~7% of the azure_llm_2023_conv block_size=1 run's wall in perf).
    if (keys.capacity() < size_t(num_blocks))
      keys.reserve(std::max(size_t(num_blocks), 2 * keys.capacity()));
    if (kind_ == SourceKind::kTokens) {
      if (int64_t{num_blocks} * block_size > int64_t(tokens_.size()))
        throw std::logic_error("token-keyed block past the request's known tokens");
      int64_t parent = have ? keys.back() : kTokenRoot;
      for (size_t i = have; i < size_t(num_blocks); ++i) {
        // hash((parent, tuple(block tokens))): the inner tuple's hash is the second lane
        const int64_t inner = pyhash::tuple_hash(tokens_.data() + i * block_size, block_size);
        pyhash::TupleHasher outer;
        outer.add_int(parent);
        outer.add_lane(inner);
        parent = outer.finish();
        keys.push_back(parent);
      }
      return;
    }
    const size_t num_prompt_blocks = size_t(num_prompt_tokens_ / block_size);
    for (; have < size_t(num_blocks) && have < num_prompt_blocks; ++have)
      keys.push_back(prompt_block_key(int32_t(have), block_size));
    for (; have < size_t(num_blocks); ++have) {
      // The block the prompt ends in chains from the whole prompt's identity, later ones
      // from their predecessor (ensure_block_hashes).
      const int64_t parent = have > num_prompt_blocks ? keys.back() : prompt_key();
      keys.push_back(pyhash::tuple_hash(parent, kGenTag));
    }
  }

 private:
  KeySource(SourceKind kind, int64_t salt, int32_t num_prompt_tokens)
      : kind_(kind), salt_(salt), num_prompt_tokens_(num_prompt_tokens) {}

  // Key of full prompt block ``i`` (a hash-id or unique source).
  int64_t prompt_block_key(int32_t i, int32_t block_size) const {
    if (kind_ == SourceKind::kHashIds && i < num_hashed_tokens_ / block_size) {
      // The chain up to the last hash id the block overlaps, mixed with its index.
      const int64_t last_id = (int64_t{i + 1} * block_size - 1) / hash_block_size_;
      const uint64_t parent = static_cast<uint64_t>(chain_[size_t(last_id)]);
      return static_cast<int64_t>(pyhash::splitmix(parent ^ pyhash::splitmix(uint64_t(i))));
    }
    // Distinct per block is all a key outside the map needs: base + i * odd constant.
    const uint64_t base = static_cast<uint64_t>(pyhash::tuple_hash(kUniqueTag, salt_));
    return static_cast<int64_t>(base + uint64_t(i) * pyhash::kGolden);
  }

  // A key equal for two requests exactly when their whole prompts are (prompt_key).
  int64_t prompt_key() const {
    if (kind_ == SourceKind::kHashIds && num_prompt_tokens_ <= num_hashed_tokens_) {
      const int64_t last = chain_[size_t((num_prompt_tokens_ - 1) / hash_block_size_)];
      return pyhash::tuple_hash(last, kPromptEndTag, num_prompt_tokens_);
    }
    return pyhash::tuple_hash(kUniqueTag, salt_, kPromptEndTag);
  }

  SourceKind kind_;
  int64_t salt_;
  int32_t num_prompt_tokens_;
  int32_t num_generated_ = 0;
  std::vector<int64_t> tokens_;  // kTokens: prompt then generated ids
  std::vector<int64_t> chain_;   // kHashIds: hash((parent, id)) along the hash ids
  int32_t hash_block_size_ = 1;
  int32_t num_hashed_tokens_ = 0;
};

}  // namespace kvsim
