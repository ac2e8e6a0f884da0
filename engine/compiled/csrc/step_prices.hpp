// A cost-mode step's seconds, from the counts the compiled v1 scheduler returns (StepInfo).
//
// The compiled mirror of kvsim/sim/executor.py's two cost-mode clocks:
// - LinearStepExecutor (``--step-time``): base + per_token x batched tokens;
// - CostModelExecutor over kvsim/costmodel/model.py's CostModel: ``decode_step_time`` when
//   every running request decodes, else ``step_time_of`` of the eight counts, over the
//   model's tables (``CostModel.step_price_terms`` hands them over, grown to the run's
//   limits).
// Every sum is written in the Python expression's order (left to right, the same
// int-to-double conversions), and the extension is built with -ffp-contract=off so that no
// multiply-add is fused: the seconds are bit-identical to the Python executor's, which the
// compiled-run tests (tests/kvsim/test_compiled_runs.py) check through whole runs' step
// durations.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "v1_requests.hpp"

namespace kvsim {

struct StepPrices {
  bool linear = true;
  // LinearStepExecutor
  double base_s = 0.0;
  double per_token_s = 0.0;
  // CostModel: tables indexed by sequences (seq, decode_*) and by tokens (token)
  std::vector<double> seq_table, token_table, decode_fixed, decode_slope, decode_base;
  double overhead = 0.0, walk = 0.0, walk_in_profile = 0.0;
  double pre_fixed = 0.0, pre_seq = 0.0, pre_causal = 0.0, pre_cached = 0.0;
  double pre_context = 0.0, pre_token = 0.0;

  // The step's seconds; ``num_running`` and ``num_cached_tokens``: the scheduler's counts
  // after scheduling it (CostModelExecutor.step_time reads them before update()).
  double price(const StepInfo& s, int64_t num_running, int64_t num_cached_tokens) const {
    if (linear) return base_s + per_token_s * double(s.num_batched_tokens);
    const int64_t n = s.num_seqs;
    if (s.kind == kDecodeStep && n == num_running) {
      // CostModel.decode_step_time_fn: every running sequence decodes
      const size_t i = index(n, decode_base);
      return decode_base[i] + decode_slope[i] * double(num_cached_tokens + n) +
             walk * double(s.blocks_walked);
    }
    return step_time_of(s);
  }

  // CostModel.step_time_of
  double step_time_of(const StepInfo& s) const {
    const int64_t nd = s.num_decode_seqs;
    double t = overhead + seq_table[index(s.num_seqs, seq_table)] +
               token_table[index(s.num_batched_tokens, token_table)];
    if (nd) {
      t = t + decode_fixed[index(nd, decode_fixed)];
      t = t + decode_slope[index(nd, decode_slope)] * double(s.decode_context_tokens);
    }
    const int64_t prefill = s.num_batched_tokens - nd;
    if (prefill) {
      t = t + (pre_fixed + pre_seq * double(s.num_seqs - nd) +
               pre_causal * double(s.prefill_causal_pairs) +
               pre_cached * double(s.prefill_cached_pairs) +
               pre_context * double(s.prefill_cached_tokens) + pre_token * double(prefill) -
               walk_in_profile * double(s.prefill_cached_tokens + prefill));
    }
    return t + walk * double(s.blocks_walked);
  }

 private:
  // The tables cover the run's max_num_seqs and max_num_batched_tokens, which no step exceeds.
  static size_t index(int64_t i, const std::vector<double>& table) {
    if (i < 0 || size_t(i) >= table.size())
      throw std::out_of_range("a step's count is beyond the step-price tables");
    return size_t(i);
  }
};

}  // namespace kvsim
