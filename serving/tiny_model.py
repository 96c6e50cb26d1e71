"""The embedded default model: a tiny GLM-family checkpoint the project makes itself.

No weights can be fetched here, so the job generates, once, a `Glm4MoeForCausalLM` directory at
tiny width: a byte-level BPE tokenizer trained on Python's own standard library, the GLM special
tokens and chat template, and seeded random weights saved as safetensors (so vLLM's real
weight-loading path runs). Same inputs, same bytes: the folder name carries a content hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

GLM_SPECIAL_TOKENS = ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>",
                      "<|assistant|>", "<|observation|>"]
# Kept as ordinary added tokens so they survive detokenization (the tool parser reads them).
GLM_MARKUP_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>",
                     "</arg_key>", "<arg_value>", "</arg_value>", "<tool_response>",
                     "</tool_response>"]

CHAT_TEMPLATE = (Path(__file__).parent / "glm_chat_template.jinja").read_text()
GENERATOR_VERSION = 1


@dataclass(frozen=True)
class TinyGlmSpec:
    """Geometry of the generated model; every field lands in the folder's hash."""

    vocab_size: int = 8192
    hidden_size: int = 256
    num_hidden_layers: int = 4
    first_k_dense_replace: int = 1
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 512
    moe_intermediate_size: int = 128
    n_routed_experts: int = 8
    num_experts_per_tok: int = 2
    n_shared_experts: int = 1
    max_position_embeddings: int = 32768
    tokenizer_corpus_bytes: int = 4_000_000
    seed: int = 0

    def digest(self) -> str:
        payload = json.dumps({**asdict(self), "v": GENERATOR_VERSION, "tpl": CHAT_TEMPLATE},
                             sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


def ensure_tiny_glm(cache_dir: str | os.PathLike, spec: TinyGlmSpec = TinyGlmSpec()) -> Path:
    """Return the model folder for `spec`, generating it first if it is not cached yet."""
    target = Path(cache_dir) / f"tiny-glm-{spec.digest()}"
    if (target / "model.safetensors").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".tiny-glm-") as tmp:
        build_tiny_glm(Path(tmp) / "model", spec)
        try:
            os.rename(Path(tmp) / "model", target)
        except OSError:  # another process finished first; its bytes are the same
            if not (target / "model.safetensors").exists():
                raise
    return target


def build_tiny_glm(out: Path, spec: TinyGlmSpec) -> None:
    out.mkdir(parents=True)
    tokenizer = _train_tokenizer(spec)
    _save_tokenizer(tokenizer, out)
    ids = {tok: tokenizer.token_to_id(tok) for tok in GLM_SPECIAL_TOKENS + GLM_MARKUP_TOKENS}
    config = _model_config(spec, ids)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    eos = [ids["<|endoftext|>"], ids["<|user|>"], ids["<|observation|>"]]
    generation = {"eos_token_id": eos, "pad_token_id": ids["<|endoftext|>"]}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    _save_weights(spec, out / "model.safetensors")


def _corpus(limit: int) -> list[str]:
    """Standard-library sources, in a fixed order: text every machine of this kind has."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if total >= limit:
            break
    return texts


def _train_tokenizer(spec: TinyGlmSpec):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    n_added = len(GLM_SPECIAL_TOKENS) + len(GLM_MARKUP_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size - n_added,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(spec.tokenizer_corpus_bytes), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in GLM_SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in GLM_MARKUP_TOKENS])
    return tok


def _save_tokenizer(tok, out: Path) -> None:
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 32768,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
        "do_lower_case": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def _model_config(spec: TinyGlmSpec, ids: dict[str, int]) -> dict:
    return {
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "moe_intermediate_size": spec.moe_intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "first_k_dense_replace": spec.first_k_dense_replace,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "partial_rotary_factor": 0.5,
        "rope_theta": 1_000_000.0,
        "max_position_embeddings": spec.max_position_embeddings,
        "n_routed_experts": spec.n_routed_experts,
        "num_experts_per_tok": spec.num_experts_per_tok,
        "n_shared_experts": spec.n_shared_experts,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "num_nextn_predict_layers": 0,
        "attention_bias": True,
        "use_qk_norm": False,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "eos_token_id": [ids["<|endoftext|>"], ids["<|user|>"], ids["<|observation|>"]],
        "pad_token_id": ids["<|endoftext|>"],
    }


def _weight_shapes(spec: TinyGlmSpec) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a GLM-4.5-format checkpoint (one tensor per expert)."""
    d, v = spec.hidden_size, spec.vocab_size
    q, kv = spec.num_attention_heads * spec.head_dim, spec.num_key_value_heads * spec.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, d),
                                          "model.norm.weight": (d,), "lm_head.weight": (v, d)}

    def mlp(prefix: str, inner: int) -> None:
        shapes[f"{prefix}.gate_proj.weight"] = (inner, d)
        shapes[f"{prefix}.up_proj.weight"] = (inner, d)
        shapes[f"{prefix}.down_proj.weight"] = (d, inner)

    for i in range(spec.num_hidden_layers):
        p = f"model.layers.{i}"
        shapes[f"{p}.input_layernorm.weight"] = (d,)
        shapes[f"{p}.post_attention_layernorm.weight"] = (d,)
        for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            shapes[f"{p}.self_attn.{name}.weight"] = (rows, d)
            shapes[f"{p}.self_attn.{name}.bias"] = (rows,)
        shapes[f"{p}.self_attn.o_proj.weight"] = (d, q)
        if i < spec.first_k_dense_replace:
            mlp(f"{p}.mlp", spec.intermediate_size)
            continue
        shapes[f"{p}.mlp.gate.weight"] = (spec.n_routed_experts, d)
        shapes[f"{p}.mlp.gate.e_score_correction_bias"] = (spec.n_routed_experts,)
        for e in range(spec.n_routed_experts):
            mlp(f"{p}.mlp.experts.{e}", spec.moe_intermediate_size)
        mlp(f"{p}.mlp.shared_experts", spec.moe_intermediate_size * spec.n_shared_experts)
    return shapes


def _save_weights(spec: TinyGlmSpec, path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    tensors = {}
    for name, shape in sorted(_weight_shapes(spec).items()):
        if name.endswith("norm.weight"):
            t = torch.ones(shape)
        elif name.endswith((".bias", "e_score_correction_bias")):
            t = torch.zeros(shape)
        else:  # a per-tensor seed keeps each tensor's bytes independent of the others
            seed = int.from_bytes(hashlib.sha256(f"{spec.seed}:{name}".encode()).digest()[:8],
                                  "little")
            gen = torch.Generator().manual_seed(seed)
            t = torch.randn(shape, generator=gen) * 0.02
        tensors[name] = t.to(torch.bfloat16).contiguous()
    save_file(tensors, str(path), metadata={"format": "pt"})


