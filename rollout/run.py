"""The rollout job: `python -m rollout.run +experiment=swe_rl [overrides]`.

Starts the serving cluster, fans sessions out to Ray actors, writes every record to disk as it
lands, and prints a summary. Every process it starts is stopped on every way out (success,
error, Ctrl-C, SIGTERM); SIGTERM ends the job with one line and exit code 143.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from envs import EnvError, load
from rollfleet.cli import ConfigError, bad_config, one_line, sigterm_received, terminate_on_sigterm
from rollfleet.paths import CONF
from rollfleet.run_dir import RunDir
from rollout.config import (
    register_schemas,
    validate,
)
from rollout.fleet import Fleet
from rollout.record import Job
from rollout.reports.corpus import build as build_corpus
from rollout.reports.corpus import corpus_message, source_of
from rollout.rl.trainer_view import save_trainer_view
from rollout.scheduler import RunAborted
from rollout.summary import SUMMARY_FIELDS, RunningTally, print_summary, summarize
from rollout.tracking import RunLogger
from serving import ServingError

log = logging.getLogger("rollout")
USER_ERRORS = (ConfigError, ServingError, EnvError, RunAborted)


def run(cfg: DictConfig) -> dict[str, Any]:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    # a sweep's members keep one cluster if they can
    fleet = Fleet(cfg, run_dir, keep_cluster=HydraConfig.get().mode == RunMode.MULTIRUN)
    groups, sink = fleet.groups, fleet.sink
    env = load(groups["env"])  # validates every task before anything starts
    done = sink.done_ids()
    jobs = [Job(t, i) for t in env.tasks for i in range(groups["rollout"].samples_per_task)
            if f"{t}/{i}" not in done]
    if done:
        log.info("resuming %s: %d rollouts already recorded%s", run_dir, len(done),
                 "" if jobs else "; nothing left to run")
    tracker = RunLogger(groups["logger"], run_dir, f"{cfg.run_name}-{run_dir.name}",
                        OmegaConf.to_container(cfg, resolve=True))
    summary: dict[str, Any] | None = None
    earlier = _earlier_summary(run_dir, done)
    start = time.perf_counter()
    try:
        # Nothing left to run: the run's figures stay those of the invocations that ran it.
        engine_cache = (_generate(fleet, jobs, tracker) if jobs else
                        {k: v for k, v in earlier.items() if k.startswith("engine_")})
        dataset = sink.finalize()
        trainer = save_trainer_view(dataset, RunDir(run_dir).trainer)
        this_run = time.perf_counter() - start if jobs else 0.0
        summary = summarize(dataset.select_columns(list(SUMMARY_FIELDS)).to_list(),
                            this_run + float(earlier.get("wall_s", 0.0))) | engine_cache
        summary.update(rollouts_this_run=len(jobs), wall_s_this_run=this_run,
                       dataset=str(sink.dataset_dir), dataset_rows=len(dataset),
                       trainer_rows=len(trainer))
        if groups["corpus"].enabled:
            corpus_dir = RunDir(run_dir).corpus
            records = dataset.to_list()
            sft, _, removed = build_corpus(records, env.tools, groups["corpus"], corpus_dir,
                                           source_of(run_dir, records, cfg))
            summary["corpus_rows"] = len(sft)
            print(corpus_message(len(sft), len(records), removed, corpus_dir), file=sys.stderr)
        RunDir(run_dir).write_summary(summary)
        print_summary(summary)
        return summary
    finally:
        tracker.finish(summary)


def _earlier_summary(run_dir: Path, done: set[str]) -> dict[str, Any]:
    """A resumed run's summary covers the whole run: what earlier invocations summed up."""
    return RunDir(run_dir).summary() if done else {}


def _generate(fleet: Fleet, jobs: list[Job], tracker: RunLogger) -> dict[str, Any]:
    """Serve the model, run the jobs on Ray actors, write each record as it lands; returns the
    engines' prefix-cache figures."""
    with fleet:
        roster = fleet.cluster.roster
        # a kept cluster's engines may have served earlier sweep members
        counted = _prefix_counters(roster.prefix_hits)
        with _progress() as progress:
            bar = progress.add_task("sessions", total=len(jobs), status="")
            tally = RunningTally()
            started = time.perf_counter()

            def on_records(records: list[dict[str, Any]]) -> None:
                fleet.sink.write(records)  # on disk before they count as done
                for record in records:
                    tracker.log_record(record)
                    tally.add(record)
                progress.update(bar, advance=len(records), status=tally.line(
                    fleet.scheduler.in_flight, time.perf_counter() - started))

            fleet.scheduler.run(jobs, on_records)
        return _engine_cache(roster.prefix_hits, counted)


def _prefix_counters(read: Callable[[], dict[str, dict[str, float]]]
                     ) -> dict[str, dict[str, float]]:
    try:
        return read()
    except ServingError as exc:
        log.warning("engine metrics unavailable: %s", exc)
        return {}


def _engine_cache(read: Callable[[], dict[str, dict[str, float]]],
                  before: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The engines' own prefix-cache counters (Prometheus) over this run, for the summary and
    wandb."""
    now = _prefix_counters(read)
    if not now:
        return {}
    zero = {"queries": 0.0, "hits": 0.0}
    stats = {name: {k: v - before.get(name, zero)[k] for k, v in s.items()}
             for name, s in now.items()}
    queries = sum(s["queries"] for s in stats.values())
    hits = sum(s["hits"] for s in stats.values())
    return {"engine_prefix_hit_rate": hits / queries if queries else 0.0,
            **{f"engine_{name}_prefix_hits": int(s["hits"]) for name, s in stats.items()}}


def _progress() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("{task.fields[status]}"),
                    console=Console(stderr=True), transient=False, refresh_per_second=2)


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    terminate_on_sigterm()
    datasets.disable_progress_bars()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request: run.log only
    try:
        trainer = validate(cfg)["trainer"]
        if trainer.enabled:  # the RL example: a trainer drives the fleet (rollout/rl/loop.py)
            from rollout.rl.reinforce import train

            train(cfg, trainer, Path(HydraConfig.get().runtime.output_dir))
        else:
            run(cfg)
    except USER_ERRORS as exc:
        sys.exit(bad_config(str(exc)))
    except KeyboardInterrupt:  # Terminated, or what Ray made of it
        if not sigterm_received():
            raise  # Ctrl-C
        out = HydraConfig.get().runtime.output_dir
        print(f"error: stopped by SIGTERM; finished rollouts are on disk in {out} "
              f"(rerun with output.dir={out} to resume)", file=sys.stderr)
        sys.exit(143)


MULTIRUN_FLAGS = ("-m", "--multirun")


def _check_overrides(argv: list[str]) -> None:
    """Compose and validate the config once before Hydra runs, so a bad experiment, key or
    value is one line (exit 2) and nothing has started. With -m, every member of the sweep is
    checked, and the line names the member."""
    multirun = any(arg in MULTIRUN_FLAGS for arg in argv)
    overrides = [arg for arg in argv if arg not in MULTIRUN_FLAGS]
    if any(arg.startswith("-") for arg in overrides):  # Hydra's other flags: leave to Hydra
        return
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    member = overrides
    try:
        with initialize_config_dir(str(CONF), version_base="1.3"):
            for member in _sweep_members(overrides) if multirun else [overrides]:
                validate(compose("config", overrides=member))
    except (ConfigError, HydraException, OmegaConfBaseException) as exc:
        name = " ".join(o for o in member if not o.startswith("hydra."))
        where = f"sweep member `{name}`: " if multirun else ""
        sys.exit(bad_config(where + one_line(exc)))


def _sweep_members(overrides: list[str]) -> list[list[str]]:
    """The members a basic Hydra sweep makes of these overrides: the cartesian product of the
    swept values (`key=a,b`), each member with the plain overrides."""
    import itertools

    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices = []
    for o in OverridesParser.create().parse_overrides(overrides):
        if o.is_sweep_override():
            key = o.get_key_element()
            choices.append([f"{key}={v}" for v in o.sweep_string_iterator()])
        else:
            choices.append([o.input_line])
    return [list(member) for member in itertools.product(*choices)]


if __name__ == "__main__":
    register_schemas()
    _check_overrides(sys.argv[1:])
    main()
