"""The decode step's memory roofline (kvsim/costmodel/roofline.py) and the guarantee users rely
on: kvsim never prices a decode step faster than the GPU's HBM can read what it must read."""

from __future__ import annotations

import pytest

from kvsim.costmodel import (
    BatchShape,
    CostModel,
    resolve_gpu,
    resolve_model,
)
from kvsim.costmodel.coefficients import load_coefficients, preset_coefficients
from kvsim.costmodel.roofline import decode_roofline

# The deployments of docs/costmodel.md's real-run checks: model and tensor-parallel size.
DEPLOYMENTS = {
    "llama-2-7b": (resolve_model("llama-2-7b"), 1),
    "llama-2-70b": (resolve_model("llama-2-70b"), 4),
    "codellama-34b": (resolve_model("codellama-34b"), 2),
    "mixtral-8x7b": (resolve_model("mixtral-8x7b"), 2),
    # FP8 experts: the bound counts them at 1 byte a weight, as the price does
    "llama-4-scout-17b-16e": (resolve_model("llama-4-scout-17b-16e"), 2),
}
BLOCK = 16


def decode_shape(num_seqs: int, context: int) -> BatchShape:
    return BatchShape.decode(num_seqs, num_seqs * context, num_seqs * -(-context // BLOCK))


def test_roofline_bytes_of_the_documented_shapes() -> None:
    """docs/costmodel.md's arithmetic: Llama-2-7B reads 12.95 GB of layer weights, 0.26 GB of
    LM head and 512 KiB of K/V a token; Mixtral-8x7B at TP2 and 128 sequences touches all 8
    experts (46.4 GB a GPU), at one sequence its top 2."""
    gpu = resolve_gpu("h100-sxm")
    llama = decode_roofline(
        resolve_model("llama-2-7b"), gpu, tp=1, num_seqs=40, context_tokens=40 * 700
    )
    assert llama.weight_bytes == pytest.approx(12.95e9, rel=1e-3)
    assert llama.lm_head_bytes == pytest.approx(0.262e9, rel=1e-2)
    assert llama.kv_bytes == 40 * 700 * 512 * 1024
    assert llama.seconds * 1e3 == pytest.approx(8.33, abs=0.01)
    mixtral = resolve_model("mixtral-8x7b")
    full = decode_roofline(mixtral, gpu, tp=2, num_seqs=128, context_tokens=128 * 2000)
    one = decode_roofline(mixtral, gpu, tp=2, num_seqs=1, context_tokens=2000)
    assert full.weight_bytes == pytest.approx(46.44e9, rel=1e-3)
    assert full.kv_bytes == 128 * 2000 * 32 * 2 * 4 * 128 * 2  # 4 of 8 KV heads a GPU
    assert one.weight_bytes < 0.3 * full.weight_bytes


@pytest.mark.parametrize("preset", ["h100-sxm", "h100-sxm+vllm-0.15"])
@pytest.mark.parametrize("name", list(DEPLOYMENTS))
def test_no_decode_step_prices_below_its_roofline(name: str, preset: str) -> None:
    """Batches of 1 to 256 sequences, contexts of 1 to 4,000 tokens (128 x 2,000: the
    overloaded held-out stages' shape), on the kernel-profile preset and the vllm-0.15 stack."""
    model, tp = DEPLOYMENTS[name]
    gpu = resolve_gpu("h100-sxm")
    co = preset_coefficients(preset) if "+" not in preset else load_coefficients(preset)
    cost = CostModel(model, gpu, tp=tp, coefficients=co)
    for num_seqs in (1, 4, 16, 40, 128, 256):
        for context in (1, 128, 700, 2000, 4000):
            bound = decode_roofline(
                model, gpu, tp=tp, num_seqs=num_seqs, context_tokens=num_seqs * context
            )
            price = cost.step_time(decode_shape(num_seqs, context))
            assert price > bound.seconds, (name, preset, num_seqs, context)
