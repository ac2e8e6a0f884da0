"""Sampling: greedy rows, the top-p nucleus, and per-token seeds."""

from __future__ import annotations

import torch

from engine.torch_engine.sampling import SamplingRow, default_request_seed, sample, token_seed


def test_greedy_rows_take_the_argmax() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    assert sample(logits, [SamplingRow(0.0, 1.0, 0), SamplingRow(0.0, 0.5, 1)]) == [1, 0]


def test_tiny_top_p_keeps_only_the_most_likely_token() -> None:
    logits = torch.tensor([[0.0, 0.1, -1.0, 0.05]])
    draws = {sample(logits, [SamplingRow(5.0, 1e-6, seed)])[0] for seed in range(50)}
    assert draws == {1}


def test_top_p_draws_stay_inside_the_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    draws = {sample(logits, [SamplingRow(1.0, 0.7, seed)])[0] for seed in range(200)}
    assert draws == {0, 1}  # 0.5 < 0.7, 0.5 + 0.3 >= 0.7: tokens 2 and 3 are cut


def test_same_seed_same_draw_and_seeds_differ_per_token() -> None:
    logits = torch.zeros(1, 1000)
    row = SamplingRow(1.0, 1.0, token_seed(42, 3))
    assert sample(logits, [row]) == sample(logits, [row])
    seeds = {token_seed(42, k) for k in range(100)} | {token_seed(43, k) for k in range(100)}
    assert len(seeds) == 200
    assert default_request_seed(0, 1) != default_request_seed(1, 0)
