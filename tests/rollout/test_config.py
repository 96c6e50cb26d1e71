"""Config: each default in one place (the dataclasses), every group checked before anything runs."""

from dataclasses import fields

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rollfleet.cli import ConfigError, typed
from rollfleet.paths import ROOT
from rollout.config import SCHEMAS, RolloutConfig, register_schemas, validate
from serving.config import ServingConfig


def _compose(*overrides):
    register_schemas()
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_the_default_job_uses_the_dataclass_defaults():
    groups = validate(_compose("+experiment=swe_rl"))
    for group in ("model", "rollout", "logger"):
        assert groups[group] == SCHEMAS[group](), group
    assert groups["serving"] == ServingConfig(seed=0)
    assert groups["env"].name == "mini_swe" and groups["env"].max_file_chars == 500


def test_group_files_hold_no_copy_of_a_default():
    """A YAML value equal to the dataclass default is a second copy of that fact."""
    for group, cls in SCHEMAS.items():
        defaults = {f.name: getattr(cls(), f.name) for f in fields(cls)}
        for path in (ROOT / "conf" / group).glob("*.yaml"):
            values = OmegaConf.to_container(OmegaConf.load(path))
            values.pop("defaults", None)
            same = [k for k, v in values.items() if k in defaults and defaults[k] == v
                    and k not in ("mode", "name", "suite")]
            assert same == [], f"{path.name} repeats defaults {same}"


@pytest.mark.parametrize(("override", "message"), [
    ("rollout.tool_constraint=bogus", "rollout.tool_constraint must be one of"),
    ("serving.logprobs=sometimes", "serving.logprobs must be one of"),
    ("serving.router_mode=foo", "serving.router_mode must be one of"),
    ("env.on_bad_task=ignore", "env.on_bad_task must be one of"),
])
def test_a_bad_choice_is_refused_when_the_config_loads(override, message):
    with pytest.raises(ConfigError, match=message):
        validate(_compose("+experiment=swe_rl", override))


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
