"""`serving=mocker`: simulated engines (Dynamo's mocker, no model) behind the real frontend;
with `serving.replay_trace` they answer from a trace (serving/dynamo/mocker.py)."""

from __future__ import annotations

from serving.dynamo.mocker import MockerWorker, replay_trace
from serving.policy import EngineControl, PolicyUpdateError
from serving.topologies.aggregated import Aggregated


class Mocker(Aggregated):
    name = "mocker"
    worker_cls = MockerWorker
    takes_kv_tier = False
    declares_version = False  # no model, no weights

    @property
    def front_door(self) -> str:  # type: ignore[override]
        return "dynamo_replay" if self.where.serving.replay_trace else "dynamo"

    def controls(self) -> list[EngineControl]:
        raise PolicyUpdateError("serving=mocker runs no model: it has no weights to update")

    def check(self) -> None:
        super().check()
        if self.where.serving.replay_trace:
            replay_trace(self.where.serving)  # a missing trace is refused before anything starts
