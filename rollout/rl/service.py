"""The rollout service: `Rollouts` (rollout/rl/loop.py) in a named Ray actor, for a trainer in
processes of its own (torchrun ranks, Ray actors, other nodes of the same Ray cluster).

    python -m rollout.rl.service +experiment=rl_loop serving=kv_routed    # runs until stopped

    client = RolloutClient.attach(rank=rank, world=world)    # in each trainer rank
    groups = client.next_groups(2)                           # this rank's groups
    client.push_weights(model_tensors)                       # every rank, at once

`push_weights` sends the weights from the ranks straight to the engines
(serving/weight_transfer.py): each rank describes the rows it sends, the service joins the
descriptions into one plan, pauses the fleet as any update does, and once the engines wait for
the rows every rank broadcasts its own; the service process never holds a tensor. A trainer
that writes checkpoint folders anyway hands one over with `push_folder`. Either way the
version, the checks and the guarantees are the in-process `Rollouts.update_weights`'s.
"""

from __future__ import annotations

import argparse
import logging
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import ray
from omegaconf import OmegaConf

from rollfleet.memory import PeakRss, rss_mib

SERVICE_NAME = "rollfleet"
NAMESPACE = "rollfleet"
POLL_S = 1.0

log = logging.getLogger(__name__)


class WeightPush:
    """One push from `world` ranks, a rank per thread: each `offer`s the rows it sends; the
    last one starts the update (`update`, in a thread of its own) with the plan joined from
    every rank's; every `offer` returns once the engines wait for the rows, or raises why they
    never will; `answer` is the update's times once it ended, or its error."""

    def __init__(self, number: int, world: int, version: int | None, mode: str | None,
                 update: Callable[[Any, int | None, str | None], dict[str, float]]) -> None:
        self.number, self.world, self.version, self.mode = number, world, version, mode
        self.update = update
        self.parts: dict[int, list[Any]] = {}
        self.lock = threading.Lock()
        self.plan: Any = None
        self.rendezvous: Any = None
        self.times: dict[str, float] | None = None
        self.error: BaseException | None = None
        self.receiving = threading.Event()
        self.done = threading.Event()

    def offer(self, rank: int, world: int, rows: list[Any]) -> tuple[dict, dict]:
        """(the rendezvous, the plan), as dicts, once the engines wait for the rows."""
        from serving import Transfer

        with self.lock:
            if world != self.world or rank in self.parts or not 0 <= rank < world:
                raise ValueError(f"rank {rank} of {world}: the push under way is of "
                                 f"{self.world} ranks, {sorted(self.parts)} in")
            self.parts[rank] = rows
            if len(self.parts) == world:
                try:
                    transfer = Transfer.from_parts([self.parts[r] for r in range(world)],
                                                   self._ready)
                except Exception as exc:  # noqa: BLE001 - every rank's offer raises it
                    self._finish(None, exc)
                else:
                    self.plan = transfer.plan
                    threading.Thread(target=self._run, args=(transfer,), daemon=True,
                                     name=f"weight-push-{self.number}").start()
        self.receiving.wait()
        if self.rendezvous is None:
            raise self.error or RuntimeError("the update ended before the engines received")
        return self.rendezvous.as_dict(), self.plan.as_dict()

    def answer(self) -> dict[str, float]:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return dict(self.times or {})

    def _run(self, transfer: Any) -> None:
        try:
            with PeakRss({"service": "self"}) as rss:
                times = self.update(transfer, self.version, self.mode)
        except BaseException as exc:  # noqa: BLE001 - every rank's `answer` raises it
            self._finish(None, exc)
        else:
            above = rss.above_start_mib()["service"]
            self._finish({**times, "service_peak_above_mib": above}, None)

    def _ready(self, rendezvous: Any) -> None:
        self.rendezvous = rendezvous
        self.receiving.set()

    def _finish(self, times: dict[str, float] | None, error: BaseException | None) -> None:
        self.times, self.error = times, error
        self.receiving.set()
        self.done.set()


@ray.remote(num_cpus=0, max_concurrency=16)
class RolloutService:
    """`Rollouts` behind a Ray actor: what a trainer calls, from any process of the cluster."""

    def __init__(self, overrides: list[str], run_dir: str, groups_per_step: int = 4,
                 ahead: int | None = None) -> None:
        import torch.distributed  # noqa: F401 - loaded once now, not by the first push

        from rollout.rl.loop import Rollouts

        self.rollouts = Rollouts(overrides, groups_per_step, ahead, Path(run_dir))
        self.rollouts.__enter__()
        self.lock = threading.Lock()
        self.pushes: dict[int, WeightPush] = {}
        self.next_push = 0
        self.stopping = threading.Lock()
        self.stopped = False  # once the dataset is written and the fleet is down

    def next_groups(self, n: int, timeout_s: float | None = None) -> list[Any]:
        return self.rollouts.next_groups(n, timeout_s)

    def update_weights(self, folder: str, version: int | None = None,
                       mode: str | None = None) -> dict[str, float]:
        """A checkpoint folder (the trainer saved one anyway) as the next version."""
        return self.rollouts.update_weights(Path(folder), version, mode)

    def offer(self, rank: int, world: int, rows: list[Any], version: int | None = None,
              mode: str | None = None) -> tuple[int, dict, dict]:
        """Rank `rank` of `world` describes the rows it sends (serving's `WeightSender`); once
        every rank has, and the engines wait for them: (the push's number, the rendezvous,
        the plan)."""
        with self.lock:
            push = self.pushes.get(self.next_push - 1)
            if push is None or push.done.is_set() or len(push.parts) == push.world:
                push = WeightPush(self.next_push, world, version, mode,
                                  self.rollouts.update_weights)
                self.next_push += 1
                # the last few, for ranks still to ask how theirs went
                self.pushes = {n: p for n, p in self.pushes.items() if n >= push.number - 2}
                self.pushes[push.number] = push
        return (push.number, *push.offer(rank, world, rows))

    def pushed(self, number: int) -> dict[str, float]:
        """Push `number`'s update times once it ended (its error if it failed)."""
        return self.pushes[number].answer()

    def status(self) -> dict[str, Any]:
        r = self.rollouts
        return {"policy_version": r.policy_version, "served": asdict(r.cluster.served),
                "model_dir": str(r.model_dir), "run_dir": str(r.run.path),
                "groups_per_step": r.groups_per_step, "samples": r.samples,
                "trainer": OmegaConf.to_container(r.cfg.trainer),
                "logprobs": r.groups_cfg["serving"].logprobs,
                "group_stats": r.group_stats.as_dict(), "broken": r.cluster.broken,
                "stopped": self.stopped, **memory()}

    def stop(self) -> str:
        """Sessions in flight end, the dataset is written, the fleet stops; the run folder
        (a second call waits for the first)."""
        with self.stopping:
            if not self.stopped:
                self.rollouts.__exit__(None, None, None)
                self.stopped = True
        return str(self.rollouts.run.path)


def memory() -> dict[str, float]:
    """This process's resident memory now and at its peak, MiB."""
    return {"rss_mib": rss_mib(),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


class RolloutClient:
    """A trainer rank's handle on the service (`attach` finds it by name)."""

    def __init__(self, service: Any, rank: int = 0, world: int = 1) -> None:
        self.service, self.rank, self.world = service, rank, world

    @classmethod
    def attach(cls, rank: int = 0, world: int = 1, name: str = SERVICE_NAME,
               address: str = "auto") -> RolloutClient:
        if not ray.is_initialized():
            from rollout.fleet import send_token_to

            send_token_to(address)
            ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING,
                     configure_logging=False)
        try:
            service = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            raise RuntimeError(f"no rollout service named {name!r} in this Ray cluster "
                               f"(start one: python -m rollout.rl.service ...)") from None
        return cls(service, rank, world)

    def next_groups(self, n: int, timeout_s: float | None = None) -> list[Any]:
        return ray.get(self.service.next_groups.remote(n, timeout_s))

    def status(self) -> dict[str, Any]:
        return ray.get(self.service.status.remote())

    def push_weights(self, tensors: Mapping[str, Any], version: int | None = None,
                     mode: str | None = None, rows: Mapping[str, Any] | None = None
                     ) -> dict[str, float]:
        """Every rank calls it at once: the new weights from the ranks to the engines. Each
        rank sends its even share of every tensor it holds whole (`tensors`), or the rows it
        holds (`rows`: name -> (rows, full shape, first row), a sharded trainer's). Returns
        the update's times and what this rank sent (`sent_bytes`, `send_s`)."""
        from serving import WeightSender

        sender = WeightSender(self.rank, self.world)
        held = dict(rows) if rows is not None else sender.rows(tensors)
        offer = self.service.offer.remote(self.rank, self.world, sender.describe(held),
                                          version, mode)
        number, rendezvous, plan = ray.get(offer)
        t0 = time.perf_counter()
        sent = sender.send(rendezvous, plan, held)
        send_s = time.perf_counter() - t0
        return {**ray.get(self.service.pushed.remote(number)), "sent_bytes": sent,
                "send_s": send_s}

    def push_folder(self, folder: str | Path, version: int | None = None,
                    mode: str | None = None) -> dict[str, float]:
        """A checkpoint folder as the next version (one rank calls it)."""
        return ray.get(self.service.update_weights.remote(str(Path(folder).absolute()),
                                                          version, mode))

    def stop(self) -> str:
        return ray.get(self.service.stop.remote())


def main(argv: list[str] | None = None) -> int:
    """Start the service, say where, run until it is stopped (a client's `stop`, Ctrl-C,
    SIGTERM); everything it started is stopped on the way out."""
    from rollfleet.cli import ConfigError, compose
    from rollout.config import SCHEMAS, register_schemas
    from rollout.fleet import init_ray

    parser = argparse.ArgumentParser(prog="python -m rollout.rl.service",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default=SERVICE_NAME)
    parser.add_argument("--groups-per-step", type=int, default=None)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as rollout.run takes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    register_schemas()
    try:
        cfg, groups = compose("config", args.overrides, SCHEMAS)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    groups_per_step = args.groups_per_step or groups["trainer"].groups_per_step
    init_ray(groups["ray"], groups["rollout"], namespace=NAMESPACE)
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    service = None
    try:
        service = RolloutService.options(name=args.name).remote(
            args.overrides, str(Path(cfg.output.dir).absolute()), groups_per_step)
        status = ray.get(service.status.remote())
        print(f"rollout service {args.name!r} ready: Ray at "
              f"{ray.get_runtime_context().gcs_address}, namespace {NAMESPACE!r}, policy "
              f"version {status['policy_version']}, run folder {status['run_dir']}",
              flush=True)
        while not stopping.wait(POLL_S):
            if ray.get(service.status.remote())["stopped"]:
                break
        print(f"rollout service {args.name!r}: records in {ray.get(service.stop.remote())}",
              flush=True)
        return 0
    except ray.exceptions.RayActorError as exc:
        print(f"error: the rollout service stopped: {exc}", file=sys.stderr)
        return 1
    finally:
        if service is not None:
            ray.kill(service)
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
