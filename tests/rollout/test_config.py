import pytest
from omegaconf import OmegaConf

from rollout.config import ConfigError, RolloutConfig, typed
from serving.config import ServingConfig


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


def test_typed_turns_environment_values_into_strings():
    cfg = typed(ServingConfig, OmegaConf.create({"extra_env": {"THREADS": 16, "ON": True}}),
                "serving")
    assert cfg.extra_env == {"THREADS": "16", "ON": "True"}
    with pytest.raises(ConfigError, match="serving.extra_env must map names to plain values"):
        typed(ServingConfig, OmegaConf.create({"extra_env": {"X": [1]}}), "serving")
