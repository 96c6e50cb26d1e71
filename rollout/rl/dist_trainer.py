"""The RL example's trainer in processes of its own: ranks under torchrun, plain data parallel
on CPU (gloo), attached to a running rollout service (rollout/rl/service.py).

    python -m rollout.rl.service +experiment=rl_loop &        # the fleet, until stopped
    torchrun --nproc-per-node 2 -m rollout.rl.dist_trainer --steps 10 --stop

Each rank holds the whole model, takes its own groups from the service, and computes the
example trainer's loss on them (rollout/rl/reinforce.py: REINFORCE with a group baseline and the
truncated importance ratio over the behaviour logprobs); the ranks average their gradients and
take the same Adam step. Then every rank sends its half of the rows of every tensor straight
to the engines (`RolloutClient.push_weights`), which serve them as the next policy version.
Rank 0 prints a line a step and writes <run>/rl_steps.json; `--keep-versions DIR` also saves
each version's weights there (DIR/v<N>, a folder an engine or a re-scorer loads).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from rollout.config import TrainerConfig
from rollout.rl.reinforce import checkpoint_tensors, policy_loss, served_dtypes
from rollout.rl.service import SERVICE_NAME, RolloutClient

DEFAULTS = TrainerConfig()


def main(argv: list[str] | None = None) -> None:
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from rollout.rl.behaviour import SessionLogprobs

    parser = argparse.ArgumentParser(prog="torchrun ... -m rollout.rl.dist_trainer",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=DEFAULTS.steps)
    parser.add_argument("--groups-per-rank", type=int, default=None,
                        help="default: the service's groups a step over the ranks")
    parser.add_argument("--lr", type=float, default=None, help="default: the service's config")
    parser.add_argument("--is-clip", type=float, default=None,
                        help="default: the service's config (trainer.is_clip)")
    parser.add_argument("--service", default=SERVICE_NAME)
    parser.add_argument("--address", default="auto", help="the Ray cluster's address")
    parser.add_argument("--keep-versions", type=Path, default=None)
    parser.add_argument("--stop", action="store_true", help="stop the service at the end")
    args = parser.parse_args(argv)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    client = RolloutClient.attach(rank, world, args.service, args.address)
    status = client.status()
    config = status["trainer"]
    lr = args.lr if args.lr is not None else config["lr"]
    is_clip = args.is_clip if args.is_clip is not None else config.get("is_clip")
    if is_clip is not None and status["logprobs"] != "behaviour":
        raise SystemExit("error: the importance ratio needs the behaviour logprobs "
                         "(serving.logprobs=behaviour), or --is-clip 0 for none")
    if is_clip == 0:
        is_clip = None
    groups = args.groups_per_rank or max(1, status["groups_per_step"] // world)
    model_dir = Path(status["model_dir"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    replay, served = SessionLogprobs(model_dir), served_dtypes(model_dir)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    steps = []
    if rank == 0:
        print(f"trainer: {world} ranks attached to {args.service!r} at policy version "
              f"{status['policy_version']}; the service holds {status['rss_mib']:.0f} MiB",
              flush=True)
    for step in range(args.steps):
        row = _step(step, client, model, optimizer, replay, served, is_clip,
                    groups, world)
        if args.keep_versions is not None and rank == 0:
            _keep(args.keep_versions, row["policy_version"], model_dir,
                  checkpoint_tensors(model.state_dict(), served))
        if rank == 0:
            steps.append(row)
            print(f"step {step:3d}  reward {row['reward_mean']:.3f}  ({row['sessions']} "
                  f"sessions, versions {row['sampled_versions']})  ratio "
                  f"{row['ratio_mean']:.3f}  wait {row['wait_s']:.1f} s  train "
                  f"{row['train_s']:.1f} s  push {row['push_s']:.2f} s (transfer "
                  f"{row['transfer_s']:.2f} s)  -> v{row['policy_version']}", flush=True)
    if rank == 0:
        out = Path(status["run_dir"]) / "rl_steps.json"
        out.write_text(json.dumps(steps, indent=2) + "\n")
        print(f"trainer: {len(steps)} steps, log in {out}", flush=True)
    dist.barrier()
    if args.stop and rank == 0:
        print(f"rollout service stopped; records in {client.stop()}", flush=True)
    dist.destroy_process_group()


def _step(step: int, client: RolloutClient, model: Any, optimizer: Any, replay: Any,
          served: dict[str, Any], is_clip: float | None, groups: int, world: int
          ) -> dict[str, Any]:
    """One step on every rank: its groups, gradients averaged over the ranks, one Adam step,
    the weights pushed; the step's log row (rewards summed over the ranks)."""
    import torch
    import torch.distributed as dist

    start = time.perf_counter()
    taken = client.next_groups(groups)
    waited = time.perf_counter() - start
    rewards = [x for g in taken for x in g.rewards if x is not None]
    loss, used, ratios = policy_loss(model, taken, replay, is_clip)
    optimizer.zero_grad()
    if loss is not None:
        loss.backward()
    for p in model.parameters():  # a rank with nothing to train on adds zeros
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
        dist.all_reduce(grad)
        p.grad = grad / world
    optimizer.step()
    trained = time.perf_counter() - start - waited
    pushed = time.perf_counter()
    times = client.push_weights(checkpoint_tensors(model.state_dict(), served))
    push_s = time.perf_counter() - pushed
    totals = torch.tensor([sum(rewards), len(rewards), used], dtype=torch.float64)
    dist.all_reduce(totals)
    versions = [None] * world
    dist.all_gather_object(versions, sorted({v for g in taken for v in g.versions}))
    status = client.status()
    return {"step": step, "policy_version": status["policy_version"],
            "reward_mean": float(totals[0] / max(1.0, float(totals[1]))),
            "sessions": int(totals[1]), "sessions_trained": int(totals[2]),
            "sampled_versions": sorted({v for vs in versions for v in vs}),
            **ratios.summary(), "wait_s": round(waited, 2), "train_s": round(trained, 2),
            "push_s": round(push_s, 3), "transfer_s": round(times["transfer_s"], 3),
            "update_s": round(times["total_s"], 3), "sent_bytes": times["sent_bytes"],
            "service_rss_mib": round(status["rss_mib"], 1),
            "service_peak_above_mib": times["service_peak_above_mib"]}


def _keep(root: Path, version: int, model_dir: Path, tensors: dict[str, Any]) -> None:
    """Version `version`'s weights as a folder beside the served model's other files."""
    from serving import save_model_folder

    save_model_folder(model_dir, root / f"v{version}", tensors)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
