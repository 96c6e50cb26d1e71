"""Agent-session workloads for the fleet simulation, written as Dynamo replay traces.

A session is a list of turns; turn t sends a prompt that extends turn t-1's prompt by its
completion and the tool's output (append-only, so the engine can reuse the whole earlier prompt),
samples `output` tokens, and the next turn starts `tool_s` after it ends. Two sources:
- the seed's shape (`seed_sessions`): a first prompt, about `growth` tokens more each turn, until
  the prompt reaches `max_prompt` tokens (140k), with tool time between turns;
- a rollfleet run folder (`record_sessions`): each record's turns[].prompt_tokens,
  completion_tokens and tool_s, resampled.

`write_trace` lays `lanes * lifetimes` sessions into a Mooncake-style JSONL (`session_id`,
`input_length`, `output_length`, `hash_ids` per 512-token block, `delay` = tool time in ms) that
`dynamo.replay` runs closed-loop with `replay_concurrency = lanes`: a lane starts its next session
when one ends, so `lanes` is the number of concurrent sessions.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from rollfleet.run_dir import RunDir

TRACE_BLOCK = 512


@dataclass(frozen=True)
class Turn:
    prompt: int  # tokens sent (the whole session so far)
    output: int  # tokens sampled
    tool_s: float  # seconds until the next turn is sent


@dataclass(frozen=True)
class SeedShape:
    """The seed's agent sessions (defaults: its published shape, plus our assumptions for what
    it leaves open: the first prompt, the tokens sampled per turn, the tool time)."""

    first_prompt: int = 8000
    growth: int = 6000  # tokens a turn adds: its completion + the tool's output
    max_prompt: int = 140_000
    output: int = 600  # sampled per turn (thinking + one tool call); jittered +-50%
    tool_s: float = 8.0  # mean seconds between turns; jittered +-50%


def seed_sessions(shape: SeedShape, count: int, seed: int = 0) -> list[list[Turn]]:
    rng = random.Random(seed)
    sessions = []
    for _ in range(count):
        turns, prompt = [], shape.first_prompt
        while prompt <= shape.max_prompt:
            output = max(1, round(shape.output * rng.uniform(0.5, 1.5)))
            turns.append(Turn(prompt, output, shape.tool_s * rng.uniform(0.5, 1.5)))
            prompt += max(shape.growth, output + 1)
        sessions.append(turns)
    return sessions


def static_sessions(isl: int, osl: int, count: int) -> list[list[Turn]]:
    """aiconfigurator's request shape: `count` one-turn sessions of `isl` tokens in and `osl` out
    (the cached prefix they share is `write_trace`'s `shared`)."""
    return [[Turn(isl, osl, 0.0)] for _ in range(count)]


def read_records(run_dir: Path) -> list[list[Turn]]:
    """The turns of every record in a rollfleet run folder (`<run>/data/*.parquet`)."""
    import pyarrow.parquet as pq

    data = RunDir(Path(run_dir)).data
    files = sorted(data.glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"{data} has no record files (*.parquet): is it a run "
                                "folder of `python -m rollout.run`?")
    sessions = []
    for path in files:
        for turns in pq.read_table(path, columns=["turns"]).column("turns").to_pylist():
            got = [Turn(int(t["prompt_tokens"]), max(1, int(t["completion_tokens"])),
                        float(t.get("tool_s") or 0.0)) for t in turns or []]
            if got:
                sessions.append(got)
    if not sessions:
        raise ValueError(f"{run_dir}: no record has turns")
    return sessions


def record_sessions(shapes: list[list[Turn]], count: int, token_scale: float = 1.0,
                    seed: int = 0) -> list[list[Turn]]:
    """`count` sessions drawn from recorded ones; `token_scale` stretches token counts (records
    of the tiny CPU model have short prompts; a scale maps them onto a production model's)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        turns = rng.choice(shapes)
        out.append([Turn(max(1, round(t.prompt * token_scale)),
                         max(1, round(t.output * token_scale)), t.tool_s) for t in turns])
    return out


def shape_summary(sessions: list[list[Turn]]) -> dict:
    turns = [t for s in sessions for t in s]
    growth = [b.prompt - a.prompt for s in sessions for a, b in zip(s, s[1:], strict=False)]
    return {"sessions": len(sessions), "turns_per_session": len(turns) / len(sessions),
            "mean_first_prompt": sum(s[0].prompt for s in sessions) / len(sessions),
            "mean_last_prompt": sum(s[-1].prompt for s in sessions) / len(sessions),
            "mean_growth": sum(growth) / len(growth) if growth else 0.0,
            "mean_output": sum(t.output for t in turns) / len(turns),
            "mean_tool_s": sum(t.tool_s for t in turns) / len(turns)}


def mean_prefix(sessions: list[list[Turn]], shared: int = 0) -> int:
    """The cached prefix a prefilled token sees on average (new-token weighted): turn t's new
    tokens follow turn t-1's prompt and completion, which earlier turns computed, and a first
    turn's follow the `shared` tokens every session starts with."""
    num = den = 0
    for s in sessions:
        cached = shared
        for t in s:
            new = max(1, t.prompt - cached)
            num += new * cached
            den += new
            cached = t.prompt + t.output
    return round(num / den) if den else 0


def write_trace(path: Path, sessions: list[list[Turn]], shared: int = 0) -> Path:
    """One JSONL line per turn; a session's lines are consecutive, in order. Every session's
    prompt opens with the same `shared` tokens (whole blocks): computed once, then cached."""
    common = list(range(shared // TRACE_BLOCK))
    next_id = len(common)
    with path.open("w") as f:
        for i, turns in enumerate(sessions):
            blocks: list[int] = list(common)
            for t, turn in enumerate(turns):
                need = -(-turn.prompt // TRACE_BLOCK)
                while len(blocks) < need:
                    blocks.append(next_id)
                    next_id += 1
                line = {"session_id": f"s{i}", "input_length": turn.prompt,
                        "output_length": turn.output, "hash_ids": blocks[:need]}
                if t == 0:
                    line["timestamp"] = 0
                else:
                    line["delay"] = round(turns[t - 1].tool_s * 1000.0, 3)
                f.write(json.dumps(line, separators=(",", ":")) + "\n")
    return path
