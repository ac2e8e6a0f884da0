"""Seeded agentic / multi-turn session traces: sessions of turns that each resend the whole
conversation so far, with think times, tool-call bursts and a system prompt per agent type.

The model (docs/formats.md, "Agentic sessions"):

- Sessions start as a renewal process (Poisson by default) at ``arrivals.rate_per_s``
  sessions per second. Each session belongs to one of ``agent_types`` agent types, uniformly;
  each type has one system prompt (its length drawn once per type).
- A session has ``turns`` user turns. The first request's prompt is the system prompt plus
  the user's tokens; every later request's prompt is the previous request's prompt, plus its
  output, plus the new tokens (a user message or a tool result). So prompts only grow, and a
  session ends early, before a request whose prompt + output would pass
  ``max_context_tokens`` (its first request is always kept).
- After each user turn's response, with probability ``tool_call_prob``, the agent makes a
  burst of ``tool_calls`` tool calls: short requests that each append a tool result and
  generate a short tool call, a ``tool_time_s`` (mean, exponential) apart instead of a think
  time.
- The trace is open loop, so a turn's arrival time cannot wait for the simulated response.
  It is the previous request's arrival + an estimated response time (``est_ttft_s`` +
  ``est_tpot_s`` x the previous output tokens) + a think time (exponential, mean
  ``think_time_s``) or a tool time.

Prefix identity is carried by ``hash_ids`` (one id per ``hash_block_size`` prompt tokens).
Each session is one append-only token stream, so a hash block's content is final once the
stream covers it whole: such a block keeps one id for the rest of the session (the agent
type's id while it lies wholly inside the system prompt, shared by every session of that
type; a session's own id after that). The last block of a prompt that the prompt does not
fill is given a fresh id that nothing else uses, since the next request fills it with other
tokens. Hence each request's hash_ids start with the ids of every block the previous request's
prompt + output covered whole. Ids are small integers handed out in the order they are first
needed.

Random numbers come from one ``numpy.random.Generator`` in a fixed order (session starts,
agent types, system prompts, turns, then per user turn and per tool call, each kind drawn as
one array), so the same spec and seed give the same trace and a byte-identical file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workloads.arrivals import ArrivalProcess, as_rng
from workloads.errors import SpecError
from workloads.lengths import LengthSpec, parse_length_spec, sample_lengths
from workloads.limits import (
    MAX_GENERATED_REQUESTS,
    MAX_TIME_S,
    MAX_TOKENS,
    is_integer,
    is_number,
)
from workloads.request import Request, Trace

if TYPE_CHECKING:
    import numpy as np

# The most agent types (each has a system prompt): more is a typo, not a workload.
MAX_AGENT_TYPES = 1_000_000

# The CLI option of each field, so an error names what the user typed.
OPTION_OF = {
    "num_sessions": "--sessions",
    "turns": "--turns",
    "agent_types": "--agent-types",
    "system_prompt": "--system-prompt",
    "user_tokens": "--user-tokens",
    "output_tokens": "--output-tokens",
    "think_time_s": "--think-time",
    "tool_call_prob": "--tool-call-prob",
    "tool_calls": "--tool-calls",
    "tool_result_tokens": "--tool-result-tokens",
    "tool_call_tokens": "--tool-call-tokens",
    "tool_time_s": "--tool-time",
    "est_ttft_s": "--est-ttft",
    "est_tpot_s": "--est-tpot",
    "max_context_tokens": "--max-context",
    "hash_block_size": "--hash-block-size",
}
_SPEC_FIELDS = (
    "turns",
    "system_prompt",
    "user_tokens",
    "output_tokens",
    "tool_calls",
    "tool_result_tokens",
    "tool_call_tokens",
)
_SECONDS_FIELDS = ("think_time_s", "tool_time_s", "est_ttft_s", "est_tpot_s")


def _spec(name: str, value: LengthSpec | str) -> LengthSpec:
    if isinstance(value, LengthSpec):
        return value
    try:
        return parse_length_spec(value)
    except SpecError as err:
        raise SpecError(f"{OPTION_OF[name]}: {err}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionSpec:
    """What :func:`session_trace` generates (tokens are counts; times in seconds).

    Attributes:
        num_sessions: sessions to generate (1 to 10^8).
        arrivals: the session start process; its rate is in sessions per second.
        turns: user turns per session (a length SPEC, e.g. ``uniform:1:8``).
        agent_types: number of agent types, each with its own system prompt.
        system_prompt: system prompt tokens, drawn once per agent type.
        user_tokens: tokens a user message adds to the prompt.
        output_tokens: tokens the model generates for a user turn.
        think_time_s: mean think time (exponential) before a user turn, after the estimated
            response to the previous request; 0 for none.
        tool_call_prob: probability (0 to 1) that a user turn's response starts a tool burst.
        tool_calls: tool calls in a burst (a length SPEC).
        tool_result_tokens: tokens a tool result adds to the prompt.
        tool_call_tokens: tokens the model generates for a tool call turn.
        tool_time_s: mean tool latency (exponential) before a tool call's request; 0 for none.
        est_ttft_s: the response-time estimate's time to first token.
        est_tpot_s: the response-time estimate's time per output token.
        max_context_tokens: a session ends before a request whose prompt + output passes this.
        hash_block_size: prompt tokens per hash id.
        seed: random seed (an integer >= 0).
        name: the trace's name.
    """

    num_sessions: int
    arrivals: ArrivalProcess
    turns: LengthSpec | str = "uniform:1:8"
    agent_types: int = 4
    system_prompt: LengthSpec | str = "uniform:500:4000"
    user_tokens: LengthSpec | str = "lognormal:200:1.0:8000"
    output_tokens: LengthSpec | str = "lognormal:300:1.0:4000"
    think_time_s: float = 15.0
    tool_call_prob: float = 0.5
    tool_calls: LengthSpec | str = "uniform:1:5"
    tool_result_tokens: LengthSpec | str = "lognormal:300:1.5:8000"
    tool_call_tokens: LengthSpec | str = "lognormal:60:0.5:1000"
    tool_time_s: float = 1.0
    est_ttft_s: float = 0.5
    est_tpot_s: float = 0.02
    max_context_tokens: int = 32768
    hash_block_size: int = 16
    seed: int = 0
    name: str = "sessions"
    _specs: dict[str, LengthSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = self.num_sessions
        if not (is_integer(n) and 1 <= n <= MAX_GENERATED_REQUESTS):
            raise SpecError(
                f"--sessions must be an integer from 1 to {MAX_GENERATED_REQUESTS:,}, got {n!r}"
            )
        object.__setattr__(
            self, "_specs", {name: _spec(name, getattr(self, name)) for name in _SPEC_FIELDS}
        )
        for name in _SECONDS_FIELDS:
            value = getattr(self, name)
            if not (is_number(value) and 0 <= value <= MAX_TIME_S):
                raise SpecError(
                    f"{OPTION_OF[name]} must be a number of seconds from 0 to "
                    f"{MAX_TIME_S:.0f} (2^32), got {value!r}"
                )
        p = self.tool_call_prob
        if not (is_number(p) and 0 <= p <= 1):
            raise SpecError(f"--tool-call-prob must be a probability from 0 to 1, got {p!r}")
        for name, high in (
            ("agent_types", MAX_AGENT_TYPES),
            ("max_context_tokens", MAX_TOKENS),
            ("hash_block_size", MAX_TOKENS),
        ):
            value = getattr(self, name)
            if not (is_integer(value) and 1 <= value <= high):
                raise SpecError(
                    f"{OPTION_OF[name]} must be an integer from 1 to {high:,}, got {value!r}"
                )
        as_rng(self.seed)  # refuses a bad seed now, before anything is drawn

    def spec(self, name: str) -> LengthSpec:
        """The parsed length SPEC of field ``name`` (e.g. ``"turns"``)."""
        return self._specs[name]


class _Ids:
    """Hash ids handed out in order of first need: small, unique integers."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, count: int = 1) -> range:
        start = self.next
        self.next += count
        return range(start, start + count)


@dataclass(slots=True)
class _Stream:
    """One session's token stream: its length so far and the ids of its whole blocks."""

    tokens: int
    block_ids: list[int]

    def hash_ids(self, ids: _Ids, block_size: int) -> tuple[int, ...]:
        """Ids of the prompt that is the stream so far: whole blocks keep their ids (new ones
        get ids now, for good); a partial last block gets a fresh id of its own."""
        whole = self.tokens // block_size
        if whole > len(self.block_ids):
            self.block_ids.extend(ids.take(whole - len(self.block_ids)))
        partial = ids.take() if self.tokens % block_size else range(0)
        return tuple(self.block_ids[:whole]) + tuple(partial)


@dataclass(frozen=True, slots=True)
class _Draws:
    """Every random number the trace needs, drawn as arrays in a fixed order."""

    starts: np.ndarray  # session start times, s
    agent: np.ndarray  # agent type per session
    system: np.ndarray  # system prompt tokens per agent type
    turns: np.ndarray  # user turns per session
    user: np.ndarray  # per user turn (all sessions' turns in order)
    output: np.ndarray
    think: np.ndarray
    burst: np.ndarray  # tool calls after the turn (0: no burst)
    result: np.ndarray  # per tool call
    call: np.ndarray
    tool_time: np.ndarray


def _draw(spec: SessionSpec, rng: np.random.Generator) -> _Draws:
    import numpy as np

    n = spec.num_sessions
    starts = spec.arrivals.times(rng, num_requests=n)
    agent = rng.integers(0, spec.agent_types, n)
    system = sample_lengths(spec.spec("system_prompt"), spec.agent_types, rng)
    if system.max() > spec.max_context_tokens:
        agent_type = int(system.argmax())
        raise SpecError(
            f"--system-prompt drew {int(system[agent_type]):,} tokens for agent type "
            f"{agent_type}, more than --max-context {spec.max_context_tokens:,}"
        )
    turns = sample_lengths(spec.spec("turns"), n, rng, column="output")
    num_turns = int(turns.sum())
    if num_turns > MAX_GENERATED_REQUESTS:
        raise SpecError(
            f"{n:,} sessions draw {num_turns:,} user turns, more than the "
            f"{MAX_GENERATED_REQUESTS:,} requests one trace may hold"
        )
    user = sample_lengths(spec.spec("user_tokens"), num_turns, rng)
    output = sample_lengths(spec.spec("output_tokens"), num_turns, rng, column="output")
    think = _exponential(rng, spec.think_time_s, num_turns)
    has_burst = rng.random(num_turns) < spec.tool_call_prob
    sizes = sample_lengths(spec.spec("tool_calls"), num_turns, rng, column="output")
    burst = np.where(has_burst, sizes, 0)
    num_calls = int(burst.sum())
    if num_turns + num_calls > MAX_GENERATED_REQUESTS:
        raise SpecError(
            f"{n:,} sessions draw {num_turns + num_calls:,} requests, more than the "
            f"{MAX_GENERATED_REQUESTS:,} one trace may hold"
        )
    result = sample_lengths(spec.spec("tool_result_tokens"), num_calls, rng)
    call = sample_lengths(spec.spec("tool_call_tokens"), num_calls, rng, column="output")
    tool_time = _exponential(rng, spec.tool_time_s, num_calls)
    return _Draws(starts, agent, system, turns, user, output, think, burst, result, call, tool_time)


def _exponential(rng: np.random.Generator, mean: float, count: int) -> np.ndarray:
    import numpy as np

    if mean == 0:
        return np.zeros(count)
    return rng.exponential(mean, count)


@dataclass(slots=True)
class _Session:
    """Builds one session's requests; ``arrival`` is the last request's unrounded time."""

    index: int
    stream: _Stream
    arrival: float
    last_output: int = 0
    count: int = 0

    def request(
        self, spec: SessionSpec, ids: _Ids, new_tokens: int, output: int, gap_s: float
    ) -> Request | None:
        """The session's next request (None when it would pass the context limit)."""
        prompt = self.stream.tokens + self.last_output + new_tokens
        if self.count and prompt + output > spec.max_context_tokens:
            return None
        if prompt > MAX_TOKENS:  # only a first request can: later ones obey the context
            raise SpecError(
                f"session {self.index}'s first prompt (system prompt + user tokens) has "
                f"{prompt:,} tokens, more than the {MAX_TOKENS:,} (2^30) a request may hold"
            )
        if self.count:
            self.arrival += spec.est_ttft_s + spec.est_tpot_s * self.last_output + gap_s
        if self.arrival > MAX_TIME_S:
            raise SpecError(
                f"session {self.index} runs past the {MAX_TIME_S:.0f} s (2^32 s) a trace may "
                "span; raise --session-rate or shorten the think and tool times"
            )
        self.stream.tokens = prompt
        request = Request(
            request_id=f"{self.index}-{self.count}",
            arrival_time_s=round(self.arrival, 6),
            prompt_tokens=prompt,
            output_tokens=output,
            hash_ids=self.stream.hash_ids(ids, spec.hash_block_size),
            session_id=str(self.index),
        )
        self.last_output = output
        self.count += 1
        return request


def session_trace(spec: SessionSpec) -> Trace:
    """The trace ``spec`` describes: request ids ``<session>-<k>`` (k counts the session's
    requests, tool calls included), session ids ``<session>``, sorted by arrival.

    Raises SpecError when the draws would give more than 10^8 requests, a prompt past 2^30
    tokens or an arrival past 2^32 s.
    """
    rng = as_rng(spec.seed)
    draws = _draw(spec, rng)
    ids = _Ids()
    block = spec.hash_block_size
    system_ids = [ids.take(int(tokens) // block) for tokens in draws.system.tolist()]
    requests: list[Request] = []
    turn = call = 0  # the next user turn's and tool call's index in the draws
    for index, (start, agent, turns) in enumerate(
        zip(draws.starts.tolist(), draws.agent.tolist(), draws.turns.tolist(), strict=True)
    ):
        session = _Session(index, _Stream(0, list(system_ids[agent])), start)
        new = int(draws.system[agent])  # the first prompt is the system prompt + a message
        ended = False
        for _ in range(turns):
            if not ended:
                request = session.request(
                    spec, ids, new + int(draws.user[turn]), int(draws.output[turn]),
                    float(draws.think[turn]),
                )  # fmt: skip
                ended = request is None
                if request is not None:
                    requests.append(request)
            new = 0
            for _ in range(int(draws.burst[turn])):
                if not ended:
                    request = session.request(
                        spec, ids, int(draws.result[call]), int(draws.call[call]),
                        float(draws.tool_time[call]),
                    )  # fmt: skip
                    ended = request is None
                    if request is not None:
                        requests.append(request)
                call += 1
            turn += 1
    return Trace(name=spec.name, hash_block_size=block, requests=requests)
