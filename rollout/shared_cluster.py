"""A sweep's members share one serving cluster.

Hydra's basic launcher runs a multirun's members one after another in one process. Members with
equal serving and model settings need the same engines, so the first member starts them and the
later ones reuse them: a temperature sweep over a large model pays for its engines' start once.
The cluster is stopped when a member needs other settings, when a member fails (the next one
starts afresh), and when the process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

from serving import ModelConfig, ServingConfig
from serving.cluster import Cluster

log = logging.getLogger(__name__)


class SharedCluster:
    """At most one running cluster, handed to every member whose settings match it."""

    def __init__(self) -> None:
        self._key: tuple[ServingConfig, ModelConfig, Path] | None = None
        self._cluster: Cluster | None = None

    @contextlib.contextmanager
    def use(self, serving: ServingConfig, model: ModelConfig, run_dir: Path,
            cache_dir: Path) -> Iterator[Cluster]:
        key = (serving, model, cache_dir)
        if self._cluster is not None and key != self._key:
            log.info("this sweep member serves with other settings: stopping the shared cluster")
            self.stop()
        if self._cluster is None:
            cluster = Cluster(serving, model, run_dir, cache_dir)
            cluster.__enter__()  # stops what it started if it fails
            self._cluster, self._key = cluster, key
        else:
            log.info("reusing this sweep's serving cluster (its logs are in %s)",
                     self._cluster.run_dir)
        try:
            yield self._cluster
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        cluster, self._cluster, self._key = self._cluster, None, None
        if cluster is not None:
            cluster.stop()


SWEEP_CLUSTER = SharedCluster()
atexit.register(SWEEP_CLUSTER.stop)
