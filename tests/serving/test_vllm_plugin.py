"""The NIXL progress-delay plugin: registered for vLLM, and it stops the progress thread spin."""

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from serving.engine.plugin import NIXL_PROGRESS_DELAY_ENV

# A process with one NIXL agent (UCX backend, progress thread on), idle for 2 s: its CPU time.
_AGENT_CPU = """
import json, os, resource, time
from serving.engine.plugin import register
register()
from nixl._api import nixl_agent, nixl_agent_config
agent = nixl_agent("probe", nixl_agent_config())
start = resource.getrusage(resource.RUSAGE_SELF)
time.sleep(2.0)
end = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu_s": end.ru_utime + end.ru_stime - start.ru_utime - start.ru_stime}))
os._exit(0)  # NIXL 1.5.1 segfaults in its exit handlers here (as the engine workers do)
"""


def _idle_agent_cpu_s(delay_us: str | None) -> float:
    env = {k: v for k, v in os.environ.items() if k != NIXL_PROGRESS_DELAY_ENV}
    env.update({"UCX_TLS": "tcp,self,sm", "UCX_NET_DEVICES": "lo"})
    if delay_us is not None:
        env[NIXL_PROGRESS_DELAY_ENV] = delay_us
    out = subprocess.run([sys.executable, "-c", _AGENT_CPU], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["cpu_s"]


def test_plugin_is_a_vllm_general_plugin():
    names = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert names.get("rollfleet") == "serving.engine.plugin:register"


def test_idle_agent_spins_without_the_delay_and_not_with_it():
    spinning = _idle_agent_cpu_s(None)
    polling = _idle_agent_cpu_s("1000")
    assert spinning > 1.0, spinning  # NIXL's default: a core's worth over 2 s idle
    assert polling < 0.3, polling


# vLLM's grammar mask stands in as a function that leaves only token 2: the plugin must hand
# the sampler the log-softmax of the logits from before it.
_UNMASKED = """
import importlib, json, torch
runner = importlib.import_module("vllm.v1.worker.gpu_model_runner")
sampler = importlib.import_module("vllm.v1.sample.sampler").Sampler
def grammar(scheduler_output, grammar_output, input_batch, logits):
    logits[:, :2] = float("-inf")
    logits[:, 3:] = float("-inf")
runner.apply_grammar_bitmask = grammar
from serving.engine.plugin import keep_unmasked_logprobs
keep_unmasked_logprobs()
class Batch:
    class sampling_metadata:
        max_num_logprobs = 0
logits = torch.tensor([[1.0, 2.0, 3.0, 0.5]])
model = torch.log_softmax(logits, -1).tolist()
runner.apply_grammar_bitmask(None, None, Batch(), logits)
print(json.dumps({"raw": sampler.compute_logprobs(logits).tolist(), "model": model,
                  "masked": logits.tolist()}))
"""


def test_raw_logprobs_are_the_models_own_not_the_grammar_masked_ones():
    out = subprocess.run([sys.executable, "-c", _UNMASKED], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["masked"][0][2] == 3.0 and got["masked"][0][0] == float("-inf")  # masked
    assert got["raw"] == got["model"]  # the forced token keeps the model's -0.46, not 0.0
    assert got["raw"][0][2] < -0.1


# vLLM's own Sampler in processed_logprobs mode, one greedy row and one sampled row: the greedy
# row's logprobs must be the point mass it was drawn from, the other row vLLM's own.
_GREEDY = """
import json, types, torch
from vllm.v1.sample.sampler import Sampler
from serving.engine.plugin import greedy_point_mass
greedy_point_mass()
sampler = Sampler(logprobs_mode="processed_logprobs")
meta = types.SimpleNamespace(
    all_greedy=False, all_random=False, max_num_logprobs=0, logprob_token_ids=None,
    temperature=torch.tensor([0.0, 1.0]), top_k=None, top_p=None, generators={},
    logitsprocs=types.SimpleNamespace(argmax_invariant=[]))
logits = torch.tensor([[1.0, 2.0, 3.0, 0.5], [0.1, 0.2, 0.3, 0.4]])
expected = torch.log_softmax(logits[1], -1).tolist()
sampled, processed = sampler.sample(logits.clone(), meta)
print(json.dumps({"sampled": sampled.tolist(), "greedy": processed[0].tolist(),
                  "sampled_row": processed[1].tolist(), "expected": expected}))
"""


def test_a_greedy_tokens_behaviour_logprob_is_its_point_mass():
    out = subprocess.run([sys.executable, "-c", _GREEDY], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["sampled"][0] == 2
    assert got["greedy"] == [float("-inf"), float("-inf"), 0.0, float("-inf")]
    assert got["sampled_row"] == pytest.approx(got["expected"], abs=1e-6)
