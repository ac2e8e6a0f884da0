"""Engine mode: the torch engine runs the trace through the same Scheduler and BlockManager."""

import pytest

from engine import LLMEngine, SamplingParams
from kvsim.analysis.load import warnings
from kvsim.config import RunConfig
from kvsim.runner import run
from kvsim.sim.engine_mode import PromptTokens, prompt_token_ids
from workloads import Request, Trace, save_trace


def request(
    rid: str, t: float, prompt: int, output: int, hash_ids=None, session_id=None
) -> Request:
    return Request(
        request_id=rid,
        arrival_time_s=t,
        prompt_tokens=prompt,
        output_tokens=output,
        hash_ids=hash_ids,
        session_id=session_id,
    )


@pytest.fixture
def tiny_trace(tmp_path):
    requests = [
        request("a", 0.0, 40, 12, (1, 2, 3)),
        request("b", 0.0, 20, 30, (1, 4)),
        request("c", 0.02, 70, 8),
        request("d", 0.03, 9, 5),
    ]
    path = tmp_path / "tiny.jsonl"
    save_trace(Trace(name="tiny", hash_block_size=16, requests=requests), path)
    return path, requests


def test_requests_sharing_hash_ids_share_prompt_tokens_and_tokens_are_deterministic():
    a = request("a", 0.0, 40, 1, (1, 2, 3))
    b = request("b", 0.0, 20, 1, (1, 4))
    tokens = PromptTokens(vocab_size=1000, seed=0, hash_block_size=16)
    ta, tb = tokens(a), tokens(b)
    assert len(ta) == 40 and len(tb) == 20
    assert ta[:16] == tb[:16] and ta[16:20] != tb[16:20]
    assert prompt_token_ids([a, b], 1000, seed=0, hash_block_size=16) == [ta, tb]
    assert PromptTokens(1000, seed=1, hash_block_size=16)(a) != ta
    assert all(3 <= t < 1000 for t in ta + tb)


def test_a_sessions_prompts_are_prefixes_of_one_token_stream():
    tokens = PromptTokens(vocab_size=1000, seed=0, hash_block_size=None)
    t1 = tokens(request("t1", 0.0, 30, 1, session_id="s"))
    t2 = tokens(request("t2", 1.0, 80, 1, session_id="s"))
    other = tokens(request("o", 1.0, 80, 1, session_id="u"))
    alone = tokens(request("x", 1.0, 80, 1))
    assert t2[:30] == t1 and len(t2) == 80
    assert other[:30] != t1 and alone[:30] != t1


def test_engine_mode_runs_every_request_to_its_output_length(tiny_trace):
    path, requests = tiny_trace
    result = run(
        RunConfig(trace=str(path), mode="engine", model="tiny-llama", block_size=4, num_blocks=64)
    )
    req = result.requests.set_index("request_id")
    for r in requests:
        assert req.loc[r.request_id, "status"] == "finished"
        assert req.loc[r.request_id, "generated_tokens"] == r.output_tokens
    steps = result.steps
    assert (steps["duration_s"] > 0).all()  # measured wall time of each forward
    assert (steps["time_s"].diff().dropna() > 0).all()
    assert result.summary["num_blocks"] == 64
    assert result.events[result.events["kind"] == "FREE"]["block_id"].nunique() > 0
    # the summary says its latencies are measurements, and how noisy (docs/metrics.md)
    assert result.summary["timing"] == "measured wall time"
    noise = result.summary["step_time_noise_cv"]
    assert noise is None or noise >= 0
    assert any(
        w.startswith("engine mode: latencies are measured") for w in warnings(result.summary)
    )


def test_engine_mode_generates_what_the_llm_engine_generates(tiny_trace):
    """The simulator's engine mode and LLMEngine.generate run the same greedy model."""
    path, requests = tiny_trace
    from kvsim.config import scheduling_limits
    from kvsim.costmodel import resolve_gpu
    from kvsim.sim.engine_mode import build_llm

    config = RunConfig(
        trace=str(path), mode="engine", model="tiny-llama", block_size=4, num_blocks=64
    )
    llm = build_llm(config, scheduling_limits(config, resolve_gpu(config.gpu)))
    prompts = prompt_token_ids(requests, llm.model_config.vocab_size, 0, 16)
    params = [SamplingParams(max_tokens=r.output_tokens, ignore_eos=True) for r in requests]
    reference = LLMEngine("tiny-llama", block_size=4, num_blocks=64).generate(prompts, params)
    outputs = llm.generate(prompts, params)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in reference]
    assert llm.block_manager.get_num_free_blocks() == 64


def test_engine_mode_with_a_tiny_pool_preempts_rejects_and_still_finishes(tiny_trace):
    # 16 blocks of 4: a (10 blocks) and b (5) are admitted together and both grow past the
    # pool, so one is preempted; c's 70-token prompt needs 18 blocks and is rejected.
    path, _ = tiny_trace
    result = run(
        RunConfig(trace=str(path), mode="engine", model="tiny-llama", block_size=4, num_blocks=16)
    )
    status = result.requests.set_index("request_id")["status"]
    assert result.summary["num_preemptions"] > 0
    assert status["c"] == "rejected"
    assert (status.drop("c") == "finished").all()


def test_engine_mode_refuses_a_max_model_len_past_the_model_unless_allowed(tiny_trace):
    """As in cost mode and vLLM: past the checkpoint's max_position_embeddings (4,096 for
    tiny-llama) only with --allow-long-max-model-len, and then with a warning."""
    from kvsim.option_spec import ConfigError

    path, _ = tiny_trace
    config = RunConfig(
        trace=str(path), mode="engine", model="tiny-llama", block_size=4, num_blocks=64,
        max_model_len=5000,
    )  # fmt: skip
    with pytest.raises(ConfigError, match="beyond the model's context of 4,096 tokens"):
        run(config)
    result = run(config.replace(allow_long_max_model_len=True))
    assert (result.requests["status"] == "finished").all()
    assert result.resolved["max_model_len"] == 5000
    assert any("simulated as a what-if" in w for w in result.resolved["warnings"])
