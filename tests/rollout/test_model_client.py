import pytest

from rollout.model_client import SamplingConfig, check_sampling
from serving import Endpoint
from serving.toolcall import MARKUP_TOKENS

GLM = {m: 8000 + i for i, m in enumerate(MARKUP_TOKENS)}


def _endpoint(markup: dict[str, int]) -> Endpoint:
    return Endpoint(base_url="http://127.0.0.1:9/v1", model="m", model_dir="/nonexistent",
                    markup_token_ids=markup)


def test_the_project_constraint_needs_every_markup_token_as_one_id():
    check_sampling(_endpoint(GLM), SamplingConfig(constraint="project"))
    partial = {m: i for m, i in GLM.items() if m != MARKUP_TOKENS[-1]}
    with pytest.raises(ValueError, match=f"no single tokens for .*{MARKUP_TOKENS[-1]}"):
        check_sampling(_endpoint(partial), SamplingConfig(constraint="project"))
    check_sampling(_endpoint(partial), SamplingConfig(constraint="stock"))


def test_an_unknown_constraint_is_refused():
    with pytest.raises(ValueError, match="unknown constraint 'lenient'"):
        check_sampling(_endpoint(GLM), SamplingConfig(constraint="lenient"))
