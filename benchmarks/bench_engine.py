"""Engine throughput: kvsim's continuous batching vs transformers generate() in static batches.

One seeded workload (default 256 requests, prompts 32-512 tokens, outputs 16-256 tokens) runs on
the same random-weight model shape twice:

- kvsim: LLMEngine.generate() over all requests (paged KV cache, continuous batching);
- transformers: generate() on static batches of `--hf-batch-size` requests in arrival order,
  prompts left-padded, each batch decoding until its longest request is done.

Output tokens/s counts each request's own output tokens only. Prints the median of `--repeats`
runs for both and the ratio kvsim / transformers (target >= 2).

    python benchmarks/bench_engine.py [--quick] [--device cuda] [--model llama-1b --dtype bfloat16]
    python benchmarks/bench_engine.py --skip-transformers --scheduler classic  # vs the default v1
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import torch

from engine.core.sequence import SamplingParams
from engine.torch_engine.llm_engine import LLMEngine
from engine.torch_engine.models.config import PRESETS

Workload = list[tuple[list[int], int]]  # (prompt token ids, output tokens) per request


def make_workload(num: int, vocab: int, seed: int, prompt: str, output: str) -> Workload:
    """`num` requests with uniform prompt and output lengths in the given 'lo-hi' ranges."""
    rng = random.Random(seed)
    p_lo, p_hi = (int(x) for x in prompt.split("-"))
    o_lo, o_hi = (int(x) for x in output.split("-"))
    return [
        ([rng.randrange(vocab) for _ in range(rng.randint(p_lo, p_hi))], rng.randint(o_lo, o_hi))
        for _ in range(num)
    ]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_kvsim(engine: LLMEngine, workload: Workload) -> int:
    """Generate every request; returns the output tokens produced."""
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for _, n in workload]
    outs = engine.generate([p for p, _ in workload], params)
    return sum(len(o.token_ids) for o in outs)


def run_transformers(model: torch.nn.Module, workload: Workload, batch: int, device: str) -> int:
    """Static padded batches in arrival order; returns the useful output tokens."""
    useful = 0
    for start in range(0, len(workload), batch):
        chunk = workload[start : start + batch]
        width = max(len(p) for p, _ in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.int64)
        mask = torch.zeros(len(chunk), width, dtype=torch.int64)
        for row, (prompt, _) in enumerate(chunk):
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        new = max(n for _, n in chunk)
        out = model.generate(  # type: ignore[operator]
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
        )
        assert out.shape[1] == width + new
        useful += sum(n for _, n in chunk)
    return useful


def hf_model(name: str, device: str, dtype: str) -> torch.nn.Module:
    import transformers

    config = dict(PRESETS[name])
    config.update(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    hf_config = transformers.LlamaConfig(**config)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(hf_config)
    return model.to(device=device, dtype=getattr(torch, dtype)).eval()


def _median_rate(run: Callable[[], int], device: str, repeats: int) -> tuple[float, float]:
    """(median output tokens/s, median seconds) over `repeats` runs."""
    rates, secs = [], []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        tokens = run()
        _sync(device)
        elapsed = time.perf_counter() - start
        rates.append(tokens / elapsed)
        secs.append(elapsed)
    return statistics.median(rates), statistics.median(secs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama", help="a preset name")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--prompt", default="32-512", help="prompt tokens, lo-hi")
    parser.add_argument("--output", default="16-256", help="output tokens, lo-hi")
    parser.add_argument("--quick", action="store_true", help="32 requests, 1 repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hf-batch-size", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--kv-cache-gib", type=float, default=None)
    parser.add_argument("--scheduler", default="v1", choices=["v1", "classic"])
    parser.add_argument("--enable-prefix-caching", action="store_true")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    num, repeats = (32, 1) if args.quick else (args.requests, args.repeats)

    vocab = int(PRESETS[args.model]["vocab_size"])
    workload = make_workload(num, vocab, args.seed, args.prompt, args.output)
    kv_bytes = None if args.kv_cache_gib is None else int(args.kv_cache_gib * 2**30)
    engine = LLMEngine(
        args.model,
        block_size=args.block_size,
        kv_cache_bytes=kv_bytes,
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
        scheduler=args.scheduler,
        enable_prefix_caching=args.enable_prefix_caching,
    )
    run_kvsim(engine, workload[:4])  # warm-up
    print(
        f"{num} requests (prompt {args.prompt}, output {args.output} tokens), model "
        f"{args.model} on {args.device} ({args.dtype}, threads={torch.get_num_threads()}), "
        f"{sum(n for _, n in workload)} output tokens; median of {repeats}"
    )
    kv_rate, kv_s = _median_rate(lambda: run_kvsim(engine, workload), args.device, repeats)
    print(
        f"  kvsim LLMEngine ({args.scheduler}, block_size {args.block_size}): "
        f"{kv_rate:10.1f} tok/s  {kv_s:7.2f} s"
    )
    if args.skip_transformers:
        return
    model = hf_model(args.model, args.device, args.dtype)
    batch = args.hf_batch_size
    run_transformers(model, workload[:2], batch, args.device)  # warm-up
    hf_rate, hf_s = _median_rate(
        lambda: run_transformers(model, workload, batch, args.device), args.device, repeats
    )
    print(f"  transformers generate (batch {batch}): {hf_rate:10.1f} tok/s  {hf_s:7.2f} s")
    print(f"  ratio kvsim / transformers          : {kv_rate / hf_rate:10.2f}  (target >= 2)")


if __name__ == "__main__":
    main()
