"""Synthetic corpora from a run's records: filter, de-duplicate, export for SFT and for tokens.

    python -m rollout.run +experiment=synth_corpus        # generate, then build RUN_DIR/corpus
    python -m rollout.reports.corpus RUN_DIR [corpus.min_reward=0 ...]   # rebuild from the records

Filters, in order (each configurable, `CorpusConfig`): status, reward threshold, invalid and
failed tool calls, length bounds, near-duplicates (the same final diff, or for sessions that
changed nothing the same normalized trajectory of calls), a per-task cap. Two exports, each a
Hugging Face dataset on disk with a dataset card (README.md): `sft/` (OpenAI chat messages with
`tool_calls` and `tool` messages, the tools' schemas per row) and `tokens/` (`input_ids`,
`loss_mask` exactly as sampled: nothing is re-tokenized). `corpus.push_to_hub=ORG/NAME` also
pushes both (needs network and a Hugging Face token; not run here).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from datasets import Dataset, Features, List, Value, disable_progress_bars, load_from_disk


@dataclass(frozen=True)
class CorpusConfig:
    enabled: bool = False  # build RUN_DIR/corpus when the job ends
    # the record statuses a kept session may have
    statuses: list[str] = field(default_factory=lambda: ["ok"])
    min_reward: float = 1.0  # a kept session's reward is at least this
    drop_invalid_calls: bool = True  # any call that could not be read or was off-schema
    drop_failed_calls: bool = False  # well-formed calls whose tool failed (a missing file...)
    min_turns: int = 1  # fewest model turns of a kept session
    max_turns: int | None = None  # most model turns of a kept session (null: any)
    max_tokens: int | None = None  # the whole session's sequence
    dedup: bool = True  # drop a near-duplicate of a kept session of the same task
    per_task_cap: int | None = None  # most sessions kept per task (null: any)
    push_to_hub: str | None = None  # ORG/NAME: push both datasets (private)


SFT_FEATURES = Features({
    "rollout_id": Value("string"), "task_id": Value("string"), "reward": Value("float32"),
    "messages": List({"role": Value("string"), "content": Value("string"),
                      "tool_calls": List({"id": Value("string"), "type": Value("string"),
                                          "function": {"name": Value("string"),
                                                       "arguments": Value("string")}}),
                      "tool_call_id": Value("string")}),
    "tools": Value("string"),  # JSON list of the OpenAI tool schemas the session had
})
TOKEN_FEATURES = Features({
    "rollout_id": Value("string"), "task_id": Value("string"), "reward": Value("float32"),
    "input_ids": List(Value("int32")), "loss_mask": List(Value("int8")),
})


def _trajectory_key(record: dict[str, Any]) -> str:
    """What the session did, whitespace-normalized: the sequence of calls and arguments."""
    calls = [(c["name"], " ".join(c["arguments"].split()))
             for t in record["turns"] for c in t["tool_calls"]]
    return json.dumps(calls)


def select(records: list[dict[str, Any]], cfg: CorpusConfig
           ) -> tuple[list[dict[str, Any]], Counter]:
    """The records that pass every filter, and how many each filter removed."""
    removed: Counter = Counter()
    kept, seen, per_task = [], set(), Counter()
    for r in records:
        if r["status"] not in cfg.statuses:
            reason = "status"
        elif r["reward"] is None or r["reward"] < cfg.min_reward:
            reason = "reward"
        elif cfg.drop_invalid_calls and r["num_invalid_tool_calls"]:
            reason = "invalid_calls"
        elif cfg.drop_failed_calls and r["tool_call_issues"]["failed"]:
            reason = "failed_calls"
        elif not r["prefix_consistent"]:
            reason = "prefix_break"  # no exact token sequence to train on
        elif r["num_turns"] < cfg.min_turns or (cfg.max_turns and r["num_turns"] > cfg.max_turns):
            reason = "turns"
        elif cfg.max_tokens and len(r["token_ids"]) > cfg.max_tokens:
            reason = "tokens"
        else:
            key = hashlib.sha256((r["final_diff"] or _trajectory_key(r)).encode()).hexdigest()
            if cfg.dedup and (r["task_id"], key) in seen:
                reason = "duplicate"
            elif cfg.per_task_cap is not None and per_task[r["task_id"]] >= cfg.per_task_cap:
                reason = "per_task_cap"
            else:
                seen.add((r["task_id"], key))
                per_task[r["task_id"]] += 1
                kept.append(r)
                continue
        removed[reason] += 1
    return kept, removed


def _sft_messages(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": m["role"], "content": m["content"],
             "tool_calls": json.loads(m["tool_calls"]) if m["tool_calls"] else [],
             "tool_call_id": m["tool_call_id"]} for m in record["messages"]]


def build(records: list[dict[str, Any]], tools: list[dict], cfg: CorpusConfig, out: Path,
          source: dict[str, Any]) -> tuple[Dataset, Dataset, Counter]:
    """Filter, then write out/sft and out/tokens with their cards; returns both and the
    counts of what each filter removed."""
    kept, removed = select(records, cfg)
    tools_json = json.dumps(tools)
    sft = Dataset.from_dict({k: [] for k in SFT_FEATURES}, features=SFT_FEATURES) if not kept \
        else Dataset.from_list([{"rollout_id": r["rollout_id"], "task_id": r["task_id"],
                                 "reward": r["reward"], "messages": _sft_messages(r),
                                 "tools": tools_json} for r in kept], features=SFT_FEATURES)
    tokens = Dataset.from_dict({k: [] for k in TOKEN_FEATURES}, features=TOKEN_FEATURES) \
        if not kept else Dataset.from_list(
            [{"rollout_id": r["rollout_id"], "task_id": r["task_id"], "reward": r["reward"],
              "input_ids": r["token_ids"], "loss_mask": r["loss_mask"]} for r in kept],
            features=TOKEN_FEATURES)
    for name, ds, what in (("sft", sft, "OpenAI chat messages with tool calls, for SFT"),
                           ("tokens", tokens, "token ids and loss masks exactly as sampled")):
        ds.save_to_disk(str(out / name), num_shards=1 if not len(ds) else None)
        (out / name / "README.md").write_text(_card(name, what, ds, len(records), removed,
                                                    cfg, source))
    if cfg.push_to_hub:
        sft.push_to_hub(cfg.push_to_hub, config_name="sft", private=True)
        tokens.push_to_hub(cfg.push_to_hub, config_name="tokens", private=True)
    return sft, tokens, removed


def _card(name: str, what: str, ds: Dataset, total: int, removed: Counter, cfg: CorpusConfig,
          source: dict[str, Any]) -> str:
    schema = "\n".join(f"- `{k}`: {v}" for k, v in ds.features.items())
    filters = "\n".join(f"- `{k}`: {v}" for k, v in asdict(cfg).items())
    drops = "\n".join(f"- {k}: {v}" for k, v in removed.most_common()) or "- none"
    return f"""---
pretty_name: rollfleet {name} corpus
---
# rollfleet corpus: {name}

{what}. Made by rollfleet from the records of one run; every row is one agent session.

## Source
- run: `{source.get("run_dir")}`
- model: `{source.get("model")}` (`{source.get("model_path")}`)
- config hash: `{source.get("config_hash")}`; environment: `{source.get("env")}`

## Counts
{len(ds)} rows kept of {total} records. Removed, by the first filter each failed:
{drops}

## Filters
{filters}

## Schema
{schema}
"""


def main(argv: list[str]) -> int:
    """`python -m rollout.reports.corpus RUN_DIR [corpus.KEY=VALUE ...]`: rebuild RUN_DIR/corpus."""
    from omegaconf import OmegaConf

    from envs import EnvConfig, load
    from rollfleet.cli import ConfigError, bad_config, typed
    from rollfleet.run_dir import RunDir

    disable_progress_bars()
    if not argv or not RunDir(Path(argv[0])).dataset.is_dir():
        return bad_config("usage: python -m rollout.reports.corpus RUN_DIR [corpus.KEY=VALUE ...] "
                          "(RUN_DIR: a finished run folder)")
    run = RunDir(Path(argv[0]))
    cfg = OmegaConf.load(run.config_file)
    overrides = OmegaConf.from_dotlist([a.removeprefix("corpus.") for a in argv[1:]])
    try:
        corpus = typed(CorpusConfig, OmegaConf.merge(cfg.get("corpus", {}), overrides), "corpus")
        env = load(typed(EnvConfig, cfg.env, "env"))
    except ConfigError as exc:
        return bad_config(str(exc))
    records = load_from_disk(str(run.dataset)).to_list()
    sft, _, removed = build(records, env.tools, corpus, run.corpus,
                            source_of(run.path, records, cfg))
    print(corpus_message(len(sft), len(records), removed, run.corpus))
    return 0


def source_of(run_dir: Path, records: list[dict[str, Any]], cfg: Any) -> dict[str, Any]:
    prov = records[0]["provenance"] if records else {}
    return {"run_dir": str(run_dir), "model": prov.get("model"),
            "model_path": prov.get("model_path"), "config_hash": prov.get("config_hash"),
            "env": cfg.env.name}


def corpus_message(kept: int, total: int, removed: Counter, out: Path) -> str:
    if kept:
        return f"corpus: {kept} of {total} sessions -> {out}/sft, {out}/tokens"
    why = ", ".join(f"{n} by {k}" for k, n in removed.most_common())
    return (f"corpus: empty: every one of the {total} records was filtered out ({why}); "
            f"lower corpus.min_reward or relax the filters (empty datasets in {out})")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
