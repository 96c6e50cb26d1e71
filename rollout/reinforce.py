"""The RL example: a minimal policy-gradient trainer (plain torch, CPU) on the served model,
driving the fleet through `Rollouts` (rollout/loop.py).

`python -m rollout.run +experiment=rl_loop` runs it: each step takes `groups_per_step`
finished groups, computes each session's log-likelihood of what it sampled under the current
weights (the completion tokens of its sequence, `loss_mask` 1), weights it by the session's
reward minus its group's mean (REINFORCE with a group baseline, as GRPO has it), takes one Adam
step, and hands the new weights to every engine as the next policy version. The example's
reward (env.reward=first_call) is 1 when a session's first tool call names env.reward_tool,
which random weights can learn to earn in minutes. Per step it logs the mean reward, the
versions the groups were sampled from, and the update's cost; the curve is written to
<run>/rl_steps.json and <run>/rl_reward.png.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from rollout.config import TrainerConfig
from rollout.loop import Group, Rollouts

log = logging.getLogger(__name__)


def policy_loss(model: Any, groups: list[Group]) -> tuple[Any, int]:
    """-sum over sessions of (reward - group mean) x log p(sampled tokens), over the sessions
    a trainer may use; (loss, sessions used)."""
    import torch

    terms, used = [], 0
    for group in groups:
        rows = [r for r in group.records if r["status"] in ("ok", "truncated")
                and r["prefix_consistent"] and r["reward"] is not None and not r["stale"]]
        if len(rows) < 2:
            continue
        baseline = sum(r["reward"] for r in rows) / len(rows)
        for r in rows:
            advantage = r["reward"] - baseline
            if advantage == 0:
                continue
            ids = torch.tensor(r["token_ids"])
            mask = torch.tensor(r["loss_mask"][1:], dtype=torch.bool)
            logits = model(ids[None, :-1]).logits[0].float()
            logp = torch.log_softmax(logits, -1).gather(1, ids[1:, None])[:, 0]
            terms.append(-advantage * logp[mask].sum())
            used += 1
    if not terms:
        return None, 0
    return torch.stack(terms).sum() / max(1, used), used


def train(cfg: DictConfig, trainer: TrainerConfig, run_dir: Path) -> list[dict[str, Any]]:
    import torch
    from transformers import AutoModelForCausalLM

    steps: list[dict[str, Any]] = []
    with Rollouts(cfg, trainer.groups_per_step, trainer.ahead, run_dir) as rollouts:
        model = AutoModelForCausalLM.from_pretrained(rollouts.model_dir, dtype=torch.float32)
        model.train()
        served = _served_dtypes(rollouts.model_dir)
        optimizer = torch.optim.Adam(model.parameters(), lr=trainer.lr)
        for step in range(trainer.steps):
            start = time.perf_counter()
            groups = rollouts.next_groups(trainer.groups_per_step)
            waited = time.perf_counter() - start
            rewards = [x for g in groups for x in g.rewards if x is not None]
            loss, used = policy_loss(model, groups)
            if loss is not None:
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            trained = time.perf_counter() - start - waited
            weights = checkpoint_tensors(model.state_dict(), served)
            times = rollouts.update_weights(weights)
            row = {"step": step, "policy_version": rollouts.policy_version,
                   "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
                   "sessions": len(rewards), "sessions_trained": used,
                   "sampled_versions": sorted({v for g in groups for v in g.versions}),
                   "mixed_groups": sum(g.mixed for g in groups),
                   "wait_s": round(waited, 2), "train_s": round(trained, 2),
                   "update_s": round(times["total_s"], 2)}
            steps.append(row)
            print(f"step {step:3d}  reward {row['reward_mean']:.3f}  "
                  f"(versions {row['sampled_versions']}, {used} sessions)  "
                  f"wait {waited:.1f} s  train {trained:.1f} s  update {times['total_s']:.1f} s",
                  flush=True)
        _write(rollouts.run.path, steps)
    return steps


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


def _served_dtypes(model_dir: Path) -> dict[str, Any]:
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
