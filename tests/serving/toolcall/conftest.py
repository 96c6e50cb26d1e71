import pytest
import xgrammar as xgr
from transformers import AutoTokenizer

from envs.tools import tool_schemas
from serving.tiny_model import ensure_tiny_glm
from serving.toolcall import SPECIAL_TOKENS


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    from rollfleet.paths import ROOT

    return AutoTokenizer.from_pretrained(ensure_tiny_glm(ROOT / ".cache" / "models"))


@pytest.fixture(scope="session")
def token_ids(tokenizer):
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    assert all(isinstance(i, int) and i >= 0 for i in ids.values())
    return ids


@pytest.fixture(scope="session")
def compiler(tokenizer):
    return xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer,
                                                                  vocab_size=len(tokenizer)))


@pytest.fixture(scope="session")
def tools():
    return tool_schemas(max_command_chars=40, max_file_chars=40)


@pytest.fixture(scope="session")
def guarded_grammar():
    """vLLM's xgrammar grammar class as the project's engines run it (serving/engine/plugin.py:
    the UTF-8 guard on every token mask)."""
    from serving.engine.plugin import hold_grammars

    hold_grammars()
    from vllm.v1.structured_output.backend_xgrammar import XgrammarGrammar

    return XgrammarGrammar
