"""A tiny random-weight transformers Llama saved with save_pretrained, and prompts for it: the
reference the engine's token-exactness tests compare against (transformers is test-only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VOCAB = 256


def save_tiny_llama(path: Path, max_position_embeddings: int) -> torch.nn.Module:
    """Build the model (seeded), save it to `path` and return it in eval mode."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        initializer_range=0.1,  # peaked logits: greedy ties are far below fp32 noise
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model: Any = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(path)
    return model  # type: ignore[no-any-return]


def shared_prefix_prompts(prefix_len: int, suffix_lens: list[int], seed: int) -> list[list[int]]:
    """Prompts that start with the same `prefix_len` tokens, then differ."""
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, VOCAB, (prefix_len,), generator=gen).tolist()
    return [prefix + torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in suffix_lens]


def hf_generate(model: torch.nn.Module, prompt: list[int], max_tokens: int) -> list[int]:
    """transformers generate(), greedy, one prompt (no padding): the generated ids."""
    with torch.no_grad():
        ids = model.generate(  # type: ignore[operator]
            torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False
        )
    return list(ids[0, len(prompt) :].tolist())
