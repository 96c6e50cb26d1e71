"""The RL example: a minimal policy-gradient trainer (plain torch, CPU) on the served model,
driving the fleet through `Rollouts` (rollout/rl/loop.py).

`python -m rollout.run +experiment=rl_loop` runs it: each step takes `groups_per_step`
finished groups and computes, under the current weights, the logprob of every sampled token
under the constraint it was sampled with (the turn's grammar mask replayed, rollout/rl/behaviour.py:
a forced token contributes 0 and no gradient; where the records carry the experts each token
was routed to, the forward replays them, rollout/rl/routing.py). Each session's tokens are
weighted by its reward minus its group's mean (REINFORCE with a group baseline, as GRPO has
it) and, since the groups were sampled by earlier versions, by the truncated importance ratio
min(pi / mu, is_clip)
(current over behaviour probability, mu from the records; `trainer.is_clip: null` leaves the
data uncorrected). One Adam step, then the new weights go to every engine as the next policy
version. The example's reward (env.reward=first_call) is 1 when a session's first tool call
names env.reward_tool, which random weights can learn to earn in minutes. Per step it logs the
mean reward, the ratio's mean and max, the clipped share, a KL estimate between the behaviour
and the current policy, the groups' lags and the update's cost, to wandb (logger) and to
<run>/rl_steps.json, and draws the curve in <run>/rl_reward.png.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rollfleet.cli import ConfigError
from rollout.config import TrainerConfig, validate
from rollout.rl.behaviour import SessionLogprobs, session_logits
from rollout.rl.loop import Group, Rollouts
from rollout.tracking import RunLogger

log = logging.getLogger(__name__)


@dataclass
class Ratios:
    """The importance ratios pi/mu of the tokens one step trained on."""

    log_ratios: list[float] = field(default_factory=list)
    clip: float | None = None

    def add(self, log_ratio: Any) -> None:
        self.log_ratios += log_ratio.tolist()

    def summary(self) -> dict[str, float]:
        """Mean and max ratio, the share clipped, and KL(mu || pi) estimated from mu's samples
        (the k3 estimator r - 1 - log r: unbiased, never negative)."""
        if not self.log_ratios:
            return {"ratio_mean": 1.0, "ratio_max": 1.0, "clipped": 0.0, "kl": 0.0}
        ratios = [math.exp(x) for x in self.log_ratios]
        return {"ratio_mean": sum(ratios) / len(ratios), "ratio_max": max(ratios),
                "clipped": (sum(r > self.clip for r in ratios) / len(ratios)
                            if self.clip is not None else 0.0),
                "kl": sum(r - 1 - x for r, x in zip(ratios, self.log_ratios, strict=True))
                / len(ratios)}


def trainable(group: Group) -> list[dict[str, Any]]:
    """The sessions of a group a trainer may use: scored, history intact, not stale."""
    return [r for r in group.records if r["status"] in ("ok", "truncated")
            and r["prefix_consistent"] and r["reward"] is not None and not r["stale"]]


def policy_loss(model: Any, groups: list[Group], replay: SessionLogprobs,
                is_clip: float | None = None) -> tuple[Any, int, Ratios]:
    """-sum over sessions of (reward - group mean) x sum over sampled tokens of
    w x log pi(token), pi under the turn's replayed mask, w = min(pi / mu, is_clip) (held
    constant; 1 when `is_clip` is None); (loss, sessions used, the ratios seen)."""
    import torch

    terms, used, ratios = [], 0, Ratios(clip=is_clip)
    for group in groups:
        rows = trainable(group)
        if len(rows) < 2:
            continue
        baseline = sum(r["reward"] for r in rows) / len(rows)
        for r in rows:
            advantage = r["reward"] - baseline
            if advantage == 0:
                continue
            current = replay.logprobs(r, session_logits(model, r))
            behaviour = torch.tensor([lp for t in r["turns"] for lp in t["completion_logprobs"]])
            log_ratio = current.detach() - behaviour
            ratios.add(log_ratio)
            weight = (torch.exp(log_ratio).clamp(max=is_clip) if is_clip is not None
                      else torch.ones_like(current))
            terms.append(-advantage * (weight * current).sum())
            used += 1
    if not terms:
        return None, 0, ratios
    return torch.stack(terms).sum() / max(1, used), used, ratios


def train(cfg: DictConfig, trainer: TrainerConfig, run_dir: Path) -> list[dict[str, Any]]:
    import torch
    from transformers import AutoModelForCausalLM

    groups_cfg = validate(cfg)
    if trainer.is_clip is not None and groups_cfg["serving"].logprobs != "behaviour":
        raise ConfigError("trainer.is_clip needs the behaviour logprobs "
                          "(serving.logprobs=behaviour): the importance ratio divides by them")
    if trainer.is_clip is not None and trainer.is_clip <= 0:
        raise ConfigError(f"trainer.is_clip must be > 0 or null, got {trainer.is_clip}")
    tracker = RunLogger(groups_cfg["logger"], run_dir, f"{cfg.run_name}-{run_dir.name}",
                        OmegaConf.to_container(cfg, resolve=True))
    steps: list[dict[str, Any]] = []
    try:
        with Rollouts(cfg, trainer.groups_per_step, trainer.ahead, run_dir) as rollouts:
            model = AutoModelForCausalLM.from_pretrained(rollouts.model_dir,
                                                         dtype=torch.float32)
            model.train()
            replay = SessionLogprobs(rollouts.model_dir)
            served = served_dtypes(rollouts.model_dir)
            optimizer = torch.optim.Adam(model.parameters(), lr=trainer.lr)
            for step in range(trainer.steps):
                row = _step(step, rollouts, model, optimizer, replay, served, trainer)
                steps.append(row)
                tracker.log_step(row)
                print(f"step {step:3d}  reward {row['reward_mean']:.3f}  (versions "
                      f"{row['sampled_versions']}, {row['sessions_trained']} sessions)  "
                      f"ratio {row['ratio_mean']:.3f} (max {row['ratio_max']:.2f}, clipped "
                      f"{row['clipped']:.3f})  kl {row['kl']:.4f}  wait {row['wait_s']:.1f} s  "
                      f"train {row['train_s']:.1f} s  update {row['update_s']:.1f} s",
                      flush=True)
            _write(rollouts.run.path, steps)
    finally:
        tracker.finish({"steps": len(steps),
                        "reward_last": steps[-1]["reward_mean"] if steps else 0.0})
    return steps


def _step(step: int, rollouts: Rollouts, model: Any, optimizer: Any, replay: SessionLogprobs,
          served: dict[str, Any], trainer: TrainerConfig) -> dict[str, Any]:
    """One trainer step: take groups, one optimizer step, hand the weights over; its log row."""
    start = time.perf_counter()
    groups = rollouts.next_groups(trainer.groups_per_step)
    waited = time.perf_counter() - start
    rewards = [x for g in groups for x in g.rewards if x is not None]
    loss, used, ratios = policy_loss(model, groups, replay, trainer.is_clip)
    if loss is not None:
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    trained = time.perf_counter() - start - waited
    times = rollouts.update_weights(checkpoint_tensors(model.state_dict(), served))
    lags = Counter(g.lag for g in groups)
    return {"step": step, "policy_version": rollouts.policy_version,
            "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
            "sessions": len(rewards), "sessions_trained": used,
            "sampled_versions": sorted({v for g in groups for v in g.versions}),
            "mixed_groups": sum(g.mixed for g in groups),
            **ratios.summary(), "lags": {str(k): v for k, v in sorted(lags.items())},
            "groups_dropped": rollouts.group_stats.dropped,
            "groups_carried": rollouts.group_stats.carried[-1],
            "wait_s": round(waited, 2), "train_s": round(trained, 2),
            "update_s": round(times["total_s"], 2)}


def checkpoint_tensors(state: dict[str, Any], served: dict[str, Any]) -> dict[str, Any]:
    """The trainer's weights under the served checkpoint's names and dtypes. transformers
    keeps a MoE layer's experts fused (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj`
    [E, H, I]); the checkpoint (and vLLM's loader) has one tensor per expert and matrix."""
    out = {}
    for name, tensor in state.items():
        t = tensor.detach()
        if name.endswith(".mlp.experts.gate_up_proj"):
            prefix, half = name.removesuffix("gate_up_proj"), t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = t[e, :half]
                out[f"{prefix}{e}.up_proj.weight"] = t[e, half:]
        elif name.endswith(".mlp.experts.down_proj"):
            prefix = name.removesuffix("down_proj")
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = t[e]
        else:
            out[name] = t
    return {k: v.to(served[k]).contiguous() for k, v in out.items() if k in served}


def served_dtypes(model_dir: Path) -> dict[str, Any]:
    """The served checkpoint's tensors and their dtypes (what new weights must match)."""
    import torch
    from safetensors import safe_open

    out = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                out[name] = f.get_slice(name).get_dtype()
    names = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
    return {k: names.get(v, torch.float32) for k, v in out.items()}


def _write(run: Path, steps: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (run / "rl_steps.json").write_text(json.dumps(steps, indent=2) + "\n")
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot([s["step"] for s in steps], [s["reward_mean"] for s in steps], marker="o")
    ax.set_xlabel("trainer step")
    ax.set_ylabel("mean reward of the step's groups")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("rl_loop: first call = the rewarded tool")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(run / "rl_reward.png", dpi=110)
    plt.close(fig)
