#!/usr/bin/env bash
# One prepared check for a lent GPU machine, under 5 minutes in all:
#   1. the engine's correctness tests on CUDA (KVSIM_TEST_DEVICE=cuda, plus the @gpu tests);
#   2. the decode-attention micro-benchmark on CUDA (paged vs dense SDPA), fp32 and bf16;
#   3. the engine benchmark on a ~1.24 B-parameter random-weight Llama (preset llama-1b, bf16):
#      kvsim continuous batching vs transformers generate() in static batches.
# Run from anywhere: bash benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
step() { echo; echo "=== $* ==="; }

step "device"
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA'; \
print(torch.__version__, torch.cuda.get_device_name(0))" || exit 1

step "correctness tests on CUDA"
KVSIM_TEST_DEVICE=cuda timeout 120 python -m pytest -q -p no:cacheprovider -m "gpu or not slow" \
    tests/engine/test_attention.py tests/engine/test_llm_engine.py tests/engine/test_models.py \
    tests/engine/test_sampling.py || status=1

step "decode attention, paged vs dense (fp32, then bf16)"
timeout 30 python benchmarks/bench_paged_attention.py --device cuda --batch 64 --context 2048 \
    --heads 32 --kv-heads 8 --head-dim 128 --iters 50 || status=1
timeout 30 python benchmarks/bench_paged_attention.py --device cuda --dtype bfloat16 --batch 64 \
    --context 2048 --heads 32 --kv-heads 8 --head-dim 128 --iters 50 || status=1

step "engine throughput, llama-1b bf16, 256 requests"
timeout 150 python benchmarks/bench_engine.py --device cuda --model llama-1b --dtype bfloat16 \
    --requests 256 --repeats 1 --kv-cache-gib 16 || status=1

echo; echo "gpu_check: $([ "$status" = 0 ] && echo OK || echo FAILED)"
exit "$status"
