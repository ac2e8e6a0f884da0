"""``kvsim gen --sessions N``: the options of the agentic session generator
(workloads.sessions) and the check that they are not mixed with a request trace's.

``kvsim gen`` (kvsim/commands/traces.py) takes these options and hands them here when
``--sessions`` is given; every other rule of ``gen`` (the output file, --seed, --name) is its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from kvsim.commands.console import fail

if TYPE_CHECKING:
    from workloads import Trace
    from workloads.arrivals import ArrivalKind


def _default(field_name: str) -> str:
    """SessionSpec's default of ``field_name`` as --help shows it (one definition)."""
    from dataclasses import fields

    from workloads.sessions import SessionSpec

    value = next(f.default for f in fields(SessionSpec) if f.name == field_name)
    return format(value, "g") if isinstance(value, float) else str(value)


def _opt(metavar: str, text: str, field_name: str | None = None) -> Any:
    shown: str | bool = _default(field_name) if field_name else False
    return typer.Option(metavar=metavar, help=text, show_default=shown)


Sessions = Annotated[
    int | None,
    _opt("N", "Generate N agentic multi-turn sessions instead of independent requests."),
]
SessionRate = Annotated[
    float | None, _opt("SESSIONS/S", "With --sessions (required): mean session start rate.")
]
Turns = Annotated[str | None, _opt("SPEC", "Sessions: user turns per session.", "turns")]
AgentTypes = Annotated[
    int | None,
    _opt("N", "Sessions: agent types, each with its own system prompt.", "agent_types"),
]
SystemPrompt = Annotated[
    str | None,
    _opt("SPEC", "Sessions: system prompt tokens, drawn per agent type.", "system_prompt"),
]
UserTokens = Annotated[
    str | None, _opt("SPEC", "Sessions: tokens of a user message.", "user_tokens")
]
OutputTokens = Annotated[
    str | None,
    _opt("SPEC", "Sessions: output tokens of a user turn.", "output_tokens"),
]
ThinkTime = Annotated[
    float | None,
    _opt("SECONDS", "Sessions: mean (exponential) think time before a user turn.", "think_time_s"),
]
ToolCallProb = Annotated[
    float | None,
    _opt("P", "Sessions: probability a user turn starts a tool-call burst.", "tool_call_prob"),
]
ToolCalls = Annotated[str | None, _opt("SPEC", "Sessions: tool calls per burst.", "tool_calls")]
ToolResultTokens = Annotated[
    str | None,
    _opt("SPEC", "Sessions: tokens a tool result appends.", "tool_result_tokens"),
]
ToolCallTokens = Annotated[
    str | None,
    _opt("SPEC", "Sessions: output tokens of a tool call.", "tool_call_tokens"),
]
ToolTime = Annotated[
    float | None, _opt("SECONDS", "Sessions: mean (exponential) tool latency.", "tool_time_s")
]
EstTtft = Annotated[
    float | None,
    _opt("SECONDS", "Sessions: assumed TTFT in the next turn's arrival time.", "est_ttft_s"),
]
EstTpot = Annotated[
    float | None,
    _opt("SECONDS", "Sessions: assumed time per output token, likewise.", "est_tpot_s"),
]
MaxContext = Annotated[
    int | None,
    _opt(
        "TOKENS",
        "Sessions: a session ends before prompt + output passes this.",
        "max_context_tokens",
    ),
]
HashBlockSize = Annotated[
    int | None, _opt("TOKENS", "Sessions: prompt tokens per hash id.", "hash_block_size")
]

# gen's option for each SessionSpec field.
_FIELD_OF_OPTION = {
    "turns": "turns",
    "agent_types": "agent_types",
    "system_prompt": "system_prompt",
    "user_tokens": "user_tokens",
    "output_tokens": "output_tokens",
    "think_time": "think_time_s",
    "tool_call_prob": "tool_call_prob",
    "tool_calls": "tool_calls",
    "tool_result_tokens": "tool_result_tokens",
    "tool_call_tokens": "tool_call_tokens",
    "tool_time": "tool_time_s",
    "est_ttft": "est_ttft_s",
    "est_tpot": "est_tpot_s",
    "max_context": "max_context_tokens",
    "hash_block_size": "hash_block_size",
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def refuse_session_options(options: dict[str, Any]) -> None:
    """Without --sessions: fail on the first session option given."""
    for name, value in options.items():
        if value is not None:
            fail(f"{_flag(name)} applies only with --sessions")


def refuse_request_options(given: dict[str, object]) -> None:
    """With --sessions: fail on the first request-trace option given (flag -> value)."""
    hints = {"--rate": "--session-rate", "--prompt": "--user-tokens", "--output": "--output-tokens"}
    for flag, value in given.items():
        if value is not None:
            hint = f"; use {hints[flag]}" if flag in hints else ""
            fail(f"{flag} does not apply with --sessions{hint}")


def session_trace_from_options(
    *,
    sessions: int,
    session_rate: float | None,
    arrival: ArrivalKind | None,
    cv: float | None,
    seed: int,
    name: str,
    options: dict[str, Any],
) -> Trace:
    """The trace of ``kvsim gen --sessions``; raises WorkloadError for bad values."""
    from workloads.arrivals import ArrivalKind, ArrivalProcess
    from workloads.sessions import SessionSpec, session_trace

    if session_rate is None:
        fail("--session-rate is required with --sessions (sessions/s)")
    process = ArrivalProcess(
        rate_per_s=session_rate,
        kind=arrival or ArrivalKind.POISSON,
        cv=1.0 if cv is None else cv,
    )
    given = {_FIELD_OF_OPTION[k]: v for k, v in options.items() if v is not None}
    spec = SessionSpec(num_sessions=sessions, arrivals=process, seed=seed, name=name, **given)
    return session_trace(spec)


# The names of gen's session options (besides --sessions and --session-rate).
SESSION_OPTIONS = frozenset(_FIELD_OF_OPTION)
