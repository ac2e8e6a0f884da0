"""Write small profile folders in Vidur's layout, from known coefficients (times in ms)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.costmodel.coefficients import StepCoefficients
from kvsim.costmodel.fit import prefill_features
from kvsim.costmodel.gpuspec import GPUSpec
from kvsim.costmodel.layer_shapes import LINEAR_OPS, LayerShapes
from kvsim.costmodel.terms import (
    allreduce_time,
    decode_attention_time,
    linear_op_times,
    prefill_attention_time,
)

TOKENS = (
    1,
    2,
    4,
    8,
    16,
    24,
    32,
    48,
    64,
    96,
    128,
    160,
    192,
    256,
    320,
    384,
    512,
    640,
    768,
    1024,
    1536,
    2048,
    3072,
    4096,
)

# (name, heads, kv_heads, hidden, intermediate): shapes unlike each other, like real models.
MODELS = (
    ("ModelA", 32, 32, 4096, 11008),
    ("ModelB", 64, 8, 8192, 28672),
    ("ModelC", 28, 4, 3584, 18944),
)


def compute_frame(
    model: tuple[str, int, int, int, int], tps: tuple[int, ...] = (1, 2, 4)
) -> pd.DataFrame:
    _, heads, kv, hidden, inter = model
    rows = [
        {
            "n_head": heads,
            "n_kv_head": kv,
            "n_embd": hidden,
            "n_expanded_embd": inter,
            "vocab_size": 32000,
            "use_gated_mlp": True,
            "num_tokens": n,
            "num_tensor_parallel_workers": tp,
        }
        for tp in tps
        if heads % tp == 0
        for n in TOKENS
    ]
    return pd.DataFrame(rows)


def _tidy(frame: pd.DataFrame) -> pd.DataFrame:
    """The loader's column names, to price a Vidur-layout frame with the terms."""
    return pd.DataFrame(
        {
            "tp": frame["num_tensor_parallel_workers"],
            "num_heads": frame["n_head"] if "n_head" in frame else frame["n_q_head"],
            "num_kv_heads": frame["n_kv_head"],
            "hidden_size": frame["n_embd"],
            "head_dim": frame["n_embd"]
            // (frame["n_head"] if "n_head" in frame else frame["n_q_head"]),
            "intermediate_size": frame.get("n_expanded_embd", 0),
            "gated_mlp": frame.get("use_gated_mlp", True),
            "dtype_bytes": 2,
        }
    )


def write_compute(
    folder: Path, co: StepCoefficients, gpu: GPUSpec, device: str, noise: float = 0.0, seed: int = 0
) -> None:
    rng = np.random.default_rng(seed)
    (folder / "compute").mkdir(parents=True, exist_ok=True)
    for model in MODELS:
        frame = compute_frame(model)
        times = linear_op_times(
            co, gpu, LayerShapes.from_frame(_tidy(frame)), frame["num_tokens"].to_numpy()
        )
        for op in LINEAR_OPS:
            factor = 1.0 + noise * rng.standard_normal(len(frame)) if noise else 1.0
            frame[f"time_stats.{op}.median"] = times[op] * factor * 1e3
        frame["time_stats.emb.median"] = 0.01
        frame.to_csv(folder / "compute" / f"{device}__{model[0]}__mlp.csv", index=False)


def write_attention(folder: Path, co: StepCoefficients, gpu: GPUSpec, device: str) -> None:
    rows = [
        {"is_prefill": False, "batch_size": b, "prefill_chunk_size": 0, "kv_cache_size": c}
        for b in (1, 2, 4, 8, 13, 16, 21, 24, 28, 32, 48, 55, 64, 96, 109, 128)
        for c in (32, 128, 256, 512, 1024, 2048, 4032)
    ] + [
        {"is_prefill": True, "batch_size": 1, "prefill_chunk_size": n, "kv_cache_size": c}
        for n in (64, 128, 256, 512, 1024, 2048)
        for c in (0, 256, 1024, 2048)
    ]
    frame = pd.DataFrame(rows).assign(
        n_embd=8192, n_q_head=64, n_kv_head=8, block_size=16, num_tensor_parallel_workers=2
    )
    tidy = _tidy(frame)
    shapes = LayerShapes.from_frame(tidy)
    decode = decode_attention_time(
        co.decode_attention, gpu, co.num_sms, shapes, frame["batch_size"], frame["kv_cache_size"]
    )
    f = prefill_features(
        frame.rename(columns={"prefill_chunk_size": "chunk_size", "kv_cache_size": "context_len"})
    )
    prefill = prefill_attention_time(
        co.prefill_attention,
        gpu,
        shapes,
        f["causal_pairs"],
        f["cached_pairs"],
        f["cached_tokens"],
        f["new_tokens"],
    )
    frame["time_stats.attn_decode.median"] = np.where(frame["is_prefill"], np.nan, decode * 1e3)
    frame["time_stats.attn_prefill.median"] = np.where(frame["is_prefill"], prefill * 1e3, np.nan)
    (folder / "attention").mkdir(parents=True, exist_ok=True)
    frame.to_csv(folder / "attention" / f"{device}__ModelB__tp2__attention.csv", index=False)


def write_allreduce(folder: Path, co: StepCoefficients, gpu: GPUSpec, system: str) -> None:
    sizes = np.unique(np.geomspace(2048, 1 << 26, 60).astype(int))
    frames = []
    for w in sorted(co.allreduce.by_num_workers):
        t = allreduce_time(co.allreduce, gpu, w, sizes)
        frames.append(
            pd.DataFrame(
                {
                    "num_workers": w,
                    "devices_per_node": w,
                    "size": sizes,
                    "collective": "all_reduce",
                    "time_stats.all_reduce.median": t * 1e3,
                }
            )
        )
    (folder / "network").mkdir(parents=True, exist_ok=True)
    pd.concat(frames).to_csv(folder / "network" / f"{system}__all_reduce.csv", index=False)
