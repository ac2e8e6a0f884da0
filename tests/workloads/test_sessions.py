"""The agentic session generator (workloads/sessions.py): prompts that resend the conversation,
hash_ids that let a prefix cache see exactly that, think times, tool bursts, seeding."""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads import ArrivalProcess, Request, SpecError, Trace, save_trace
from workloads.sessions import SessionSpec, session_trace


def spec(**changes: object) -> SessionSpec:
    fields: dict[str, object] = {
        "num_sessions": 30,
        "arrivals": ArrivalProcess(rate_per_s=2.0),
        "turns": "uniform:1:6",
        "agent_types": 3,
        "system_prompt": "uniform:20:200",
        "user_tokens": "uniform:1:60",
        "output_tokens": "uniform:1:80",
        "tool_calls": "uniform:1:4",
        "tool_result_tokens": "uniform:1:40",
        "tool_call_tokens": "uniform:1:10",
        "max_context_tokens": 2000,
        "hash_block_size": 16,
        "seed": 1,
    }
    fields.update(changes)
    return SessionSpec(**fields)  # type: ignore[arg-type]


def by_session(trace: Trace) -> dict[str, list[Request]]:
    """Each session's requests in the order the session sends them."""
    sessions: dict[str, list[Request]] = defaultdict(list)
    for request in trace.requests:
        assert request.session_id is not None
        sessions[request.session_id].append(request)
    for requests in sessions.values():
        requests.sort(key=lambda r: int(r.request_id.split("-")[1]))
    return sessions


def check_prefix_identity(trace: Trace) -> None:
    """What a prefix cache relies on (docs/formats.md, "Agentic sessions")."""
    size = trace.hash_block_size
    assert size is not None
    sessions = by_session(trace)
    for requests in sessions.values():
        for before, after in itertools.pairwise(requests):
            # The next prompt is this prompt + its output + at least one new token.
            assert after.prompt_tokens > before.prompt_tokens + before.output_tokens
            assert before.hash_ids is not None and after.hash_ids is not None
            # Its hash_ids start with every block this prompt + output covered whole ...
            whole = (before.prompt_tokens + before.output_tokens) // size
            assert (
                after.hash_ids[: before.prompt_tokens // size]
                == (before.hash_ids[: before.prompt_tokens // size])
            )
            # ... and those blocks keep their ids in every later request of the session.
            for later in requests[requests.index(after) :]:
                assert later.hash_ids is not None
                assert later.hash_ids[:whole] == after.hash_ids[:whole]
    # An id stands for one chain: the same id is always at the same position after the same
    # ids, so equal ids mean equal tokens up to the end of that block. Checked link by link
    # (an id always at the same position after the same parent id, which by induction is the
    # same chain): comparing whole prefixes was quadratic in a prompt's blocks, 45 s for one
    # drawn case of 1-token blocks.
    chain: dict[int, tuple[int, int | None]] = {}
    uses: dict[int, int] = defaultdict(int)
    for request in trace.requests:
        ids = request.hash_ids
        assert ids is not None and len(ids) == -(-request.prompt_tokens // size)
        for k in range(request.prompt_tokens // size):
            link = (k, ids[k - 1] if k else None)
            assert chain.setdefault(ids[k], link) == link
        for h in ids:
            uses[h] += 1
    # A prompt's partial last block is filled with other tokens by the next request: its id
    # is used by no other request (and by no whole block).
    for request in trace.requests:
        assert request.hash_ids is not None
        if request.prompt_tokens % size:
            last = request.hash_ids[-1]
            assert uses[last] == 1 and last not in chain


lengths = st.one_of(
    st.integers(1, 300).map(str),
    st.tuples(st.integers(1, 100), st.integers(0, 200)).map(lambda t: f"uniform:{t[0]}:{sum(t)}"),
)


@settings(max_examples=40, deadline=None)
@given(
    block=st.integers(1, 64),
    system=lengths,
    user=lengths,
    output=lengths,
    result=lengths,
    call=lengths,
    prob=st.sampled_from([0.0, 0.3, 1.0]),
    agent_types=st.integers(1, 4),
    seed=st.integers(0, 2**32),
)
def test_each_prompt_extends_the_last_prompt_and_output_block_for_block(
    block: int,
    system: str,
    user: str,
    output: str,
    result: str,
    call: str,
    prob: float,
    agent_types: int,
    seed: int,
) -> None:
    trace = session_trace(
        spec(
            num_sessions=8,
            hash_block_size=block,
            system_prompt=system,
            user_tokens=user,
            output_tokens=output,
            tool_result_tokens=result,
            tool_call_tokens=call,
            tool_call_prob=prob,
            agent_types=agent_types,
            max_context_tokens=4000,
            seed=seed,
        )
    )
    check_prefix_identity(trace)
    for requests in by_session(trace).values():
        for request in requests[1:]:
            assert request.prompt_tokens + request.output_tokens <= 4000


def test_sessions_of_one_agent_type_share_its_system_prompt_blocks_only() -> None:
    trace = session_trace(spec(agent_types=1, system_prompt="100", hash_block_size=16))
    firsts = [requests[0] for requests in by_session(trace).values()]
    assert len(firsts) == 30
    system_ids = {r.hash_ids[:6] for r in firsts if r.hash_ids}  # 6 whole blocks of 100 tokens
    assert len(system_ids) == 1
    # The block holding the system prompt's last 4 tokens also holds the session's own.
    assert len({r.hash_ids[6] for r in firsts if r.hash_ids}) == 30


def test_same_seed_same_bytes_other_seed_other_trace(tmp_path: Path) -> None:
    paths = [tmp_path / f"{i}.jsonl" for i in range(3)]
    for path, seed in zip(paths, (5, 5, 6), strict=True):
        save_trace(session_trace(spec(seed=seed)), path)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert paths[0].read_bytes() != paths[2].read_bytes()


def test_arrival_is_previous_arrival_plus_estimated_response_plus_gap() -> None:
    trace = session_trace(
        spec(
            output_tokens="50",
            tool_call_tokens="10",
            think_time_s=0.0,
            tool_time_s=0.0,
            est_ttft_s=0.25,
            est_tpot_s=0.01,
        )
    )
    for requests in by_session(trace).values():
        for before, after in itertools.pairwise(requests):
            gap = after.arrival_time_s - before.arrival_time_s
            assert gap == pytest.approx(0.25 + 0.01 * before.output_tokens, abs=2e-6)


def test_think_times_separate_user_turns_and_tool_times_tool_calls() -> None:
    """Tool calls follow their turn by about the tool time; user turns by the think time."""
    trace = session_trace(
        spec(
            num_sessions=200,
            turns="fixed:3",
            tool_call_prob=1.0,
            tool_calls="fixed:2",
            tool_result_tokens="7",
            user_tokens="30",
            think_time_s=20.0,
            tool_time_s=0.5,
            est_ttft_s=0.0,
            est_tpot_s=0.0,
            max_context_tokens=100_000,
        )
    )
    user_gaps: list[float] = []
    tool_gaps: list[float] = []
    for requests in by_session(trace).values():
        assert len(requests) == 3 * (1 + 2)  # every turn starts a burst of two tool calls
        for before, after in itertools.pairwise(requests):
            added = after.prompt_tokens - before.prompt_tokens - before.output_tokens
            gap = after.arrival_time_s - before.arrival_time_s
            (tool_gaps if added == 7 else user_gaps).append(gap)
    assert len(tool_gaps) == 200 * 6 and len(user_gaps) == 200 * 2
    assert sum(user_gaps) / len(user_gaps) == pytest.approx(20.0, rel=0.15)
    assert sum(tool_gaps) / len(tool_gaps) == pytest.approx(0.5, rel=0.15)


def test_without_tool_calls_a_session_has_its_turns() -> None:
    trace = session_trace(spec(turns="fixed:4", tool_call_prob=0.0, max_context_tokens=10**6))
    assert {len(r) for r in by_session(trace).values()} == {4}
    assert len(trace) == 30 * 4


def test_sessions_start_as_the_arrival_process_says() -> None:
    import numpy as np

    trace = session_trace(spec(num_sessions=2000, arrivals=ArrivalProcess(rate_per_s=4.0)))
    starts = np.array(sorted(r[0].arrival_time_s for r in by_session(trace).values()))
    gaps = np.diff(starts)
    assert gaps.mean() == pytest.approx(0.25, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.1)  # Poisson


def test_a_session_ends_before_passing_the_context() -> None:
    trace = session_trace(spec(turns="fixed:50", max_context_tokens=600, system_prompt="100"))
    sessions = by_session(trace).values()
    assert all(len(r) < 50 for r in sessions)
    assert all(r.prompt_tokens + r.output_tokens <= 600 for s in sessions for r in s[1:])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_sessions": 0}, "--sessions must be an integer from 1"),
        ({"turns": "uniform:3"}, "--turns: bad length SPEC"),
        ({"user_tokens": "fixed:0"}, "--user-tokens: "),
        ({"think_time_s": -1.0}, "--think-time must be a number of seconds"),
        ({"tool_time_s": float("nan")}, "--tool-time must be"),
        ({"est_tpot_s": float("inf")}, "--est-tpot must be"),
        ({"tool_call_prob": 1.5}, "--tool-call-prob must be a probability"),
        ({"agent_types": 0}, "--agent-types must be an integer from 1"),
        ({"hash_block_size": 2**31}, "--hash-block-size must be an integer"),
        ({"max_context_tokens": 1.5}, "--max-context must be an integer"),
        ({"seed": -1}, "seed must be an integer >= 0"),
    ],
)
def test_bad_values_are_refused_naming_the_option(changes: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match="^" + message.replace("(", r"\(")):
        spec(**changes)


def test_a_system_prompt_past_the_context_is_refused() -> None:
    with pytest.raises(SpecError, match=r"--system-prompt drew 3,000 tokens for agent type 0, "):
        session_trace(spec(system_prompt="3000", max_context_tokens=2000))


def test_arrivals_past_the_clock_limit_are_refused() -> None:
    with pytest.raises(SpecError, match=r"runs past the 4294967296 s"):
        session_trace(
            spec(
                num_sessions=1,
                turns="fixed:10",
                think_time_s=2.0**32,  # nine think times of mean 2^32 s
                tool_call_prob=0.0,
                max_context_tokens=10**6,
            )
        )
