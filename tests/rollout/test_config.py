import pytest
from omegaconf import OmegaConf

from rollout.config import ConfigError, RolloutConfig, typed


def test_typed_builds_the_dataclass():
    cfg = typed(RolloutConfig, OmegaConf.create({"samples_per_task": 3}), "rollout")
    assert cfg.samples_per_task == 3 and cfg.max_turns == RolloutConfig().max_turns


@pytest.mark.parametrize(("values", "message"), [
    ({"nope": 1}, "unknown key"),
    ({"workers": "two"}, "rollout.workers must be a number"),
    ({"workers": 1.5}, "rollout.workers must be an integer"),
])
def test_typed_rejects(values, message):
    with pytest.raises(ConfigError, match=message):
        typed(RolloutConfig, OmegaConf.create(values), "rollout")
