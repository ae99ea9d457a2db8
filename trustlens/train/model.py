"""The tiny policy model of the built-in run: a word-level tokenizer and a Llama-style causal LM.

Tokenizer: one token per integer 0..`max_number`, the operators, ``=``, ``;``, ``answer`` and the
special tokens ``<pad> <bos> <eos> <unk>``; words are whitespace-separated and encoding a text
prepends ``<bos>``. It is built in code (nothing is downloaded) and is the same on every machine.

Model: a transformers Llama (dense, the default), or with `ModelConfig.num_experts` > 0 a
Qwen3-MoE: the same attention and sizes, each MoE layer's MLP replaced by `num_experts` SwiGLU
experts of which a softmax router picks `experts_per_token` per token, trained with the router's
load-balancing loss (`MOE`: 8 experts, top-2, the first layer dense).

Checkpoint: a folder with ``model.safetensors`` (weights, float32), ``config.json`` (the
transformers LlamaConfig or Qwen3MoeConfig), ``tokenizer.json`` and ``meta.json`` (how it was
made, its held-out accuracy). `load_checkpoint()` without a path loads the shipped warm start,
``data/warmstart``, which ``trustlens warmup`` rebuilds (``data/warmstart_moe`` and
``trustlens warmup --model moe`` for the MoE).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from trustlens.paths import data_path

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")  # ids 0..3, in this order
WORDS = ("+", "-", "*", "=", ";", "answer")  # the non-number words of the task
MAX_NUMBER = 999  # the largest integer with its own token

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
META_FILE = "meta.json"
REBUILD_HINT = "rebuild it with `trustlens warmup{model} --out {path}`"
WARM_STARTS = {"dense": "warmstart", "moe": "warmstart_moe"}  # model kind -> its shipped warm start in data/
# model_type of config.json -> (config class, model class)
ARCHITECTURES: dict[str, tuple[type[PreTrainedConfig], type[PreTrainedModel]]] = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
}


def build_tokenizer(max_number: int = MAX_NUMBER) -> PreTrainedTokenizerFast:
    """The task's word-level tokenizer (deterministic: the same ids for the same `max_number`).

    Ids: 0 ``<pad>``, 1 ``<bos>``, 2 ``<eos>``, 3 ``<unk>``, then `WORDS`, then ``"0"`` ..
    ``str(max_number)``; vocabulary size ``len(SPECIAL_TOKENS) + len(WORDS) + max_number + 1``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    if max_number < 1:
        raise ValueError(f"build_tokenizer: max_number must be >= 1, got {max_number}")
    words = [*SPECIAL_TOKENS, *WORDS, *(str(i) for i in range(max_number + 1))]
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return _wrap(tok)


def _wrap(tok) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
    )


@dataclass(frozen=True)
class ModelConfig:
    """Size of the policy model (a transformers Llama, or a Qwen3-MoE when num_experts > 0); the
    defaults give the dense 1.11M-parameter model, `MOE` the mixture of experts."""

    vocab_size: int = len(SPECIAL_TOKENS) + len(WORDS) + MAX_NUMBER + 1  # = len(build_tokenizer())
    hidden_size: int = 128  # residual stream width
    num_layers: int = 4  # transformer blocks
    num_heads: int = 4  # attention heads (head size hidden_size / num_heads)
    intermediate_size: int = 384  # SwiGLU hidden width
    max_positions: int = 64  # longest prompt + response, in tokens
    rope_theta: float = 10000.0  # rotary embedding base
    tie_embeddings: bool = False  # share the input embedding with the output layer
    number_periods: tuple[float, ...] = (2, 5, 10, 20, 50, 100, 200, 500, 1000)  # see build_model
    number_scale: float = 0.05  # amplitude of the number features at init (0 = plain random init)
    num_experts: int = 0  # experts per MoE layer; 0 = the dense Llama
    experts_per_token: int = 2  # k: experts the router picks per token (top-k)
    expert_intermediate_size: int = 128  # SwiGLU hidden width of each expert
    dense_layers: tuple[int, ...] = (0,)  # with experts: the layers that keep a dense MLP (intermediate_size)
    router_aux_loss_coef: float = 0.01  # weight of the router's load-balancing loss in the training loss

    @property
    def kind(self) -> str:
        """ "moe" or "dense"."""
        return "moe" if self.num_experts else "dense"

    def _shared(self) -> dict[str, Any]:
        """The keywords both transformers configs take: sizes, positions, the special-token ids of
        `build_tokenizer`."""
        return {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_heads,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_positions,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "tie_word_embeddings": self.tie_embeddings,
            "pad_token_id": SPECIAL_TOKENS.index("<pad>"),
            "bos_token_id": SPECIAL_TOKENS.index("<bos>"),
            "eos_token_id": SPECIAL_TOKENS.index("<eos>"),
            "attention_dropout": 0.0,
        }

    def to_transformers(self) -> PreTrainedConfig:
        """The transformers config: `to_llama()`, or the Qwen3MoeConfig with experts."""
        if not self.num_experts:
            return self.to_llama()
        return Qwen3MoeConfig(
            **self._shared(),
            moe_intermediate_size=self.expert_intermediate_size,
            num_experts=self.num_experts,
            num_experts_per_tok=self.experts_per_token,
            norm_topk_prob=True,
            mlp_only_layers=list(self.dense_layers),
            decoder_sparse_step=1,
            router_aux_loss_coef=self.router_aux_loss_coef,
            output_router_logits=False,
        )

    def to_llama(self) -> LlamaConfig:
        """The equivalent transformers LlamaConfig (special-token ids of `build_tokenizer`)."""
        return LlamaConfig(**self._shared())


# the built-in mixture of experts (`--model moe`): 8 experts, top-2, layer 0 dense
MOE = ModelConfig(num_experts=8)
MODELS = {"dense": ModelConfig(), "moe": MOE}  # `--model` choice -> its size


def build_model(cfg: ModelConfig = ModelConfig(), seed: int = 0) -> PreTrainedModel:
    """A freshly initialised float32 model; the same weights for the same (cfg, seed).

    The input and output embedding rows of the number tokens start as random init plus
    ``number_scale · [cos(2πn/P), sin(2πn/P) for P in number_periods]`` in their first
    2·len(number_periods) dimensions, n being the token's value: a number line with periodic
    structure, like the one pretrained LLMs learn for numbers, as a head start for the warm-up.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        config = cfg.to_transformers()
        model = ARCHITECTURES[config.model_type][1](config)
    if cfg.number_scale:
        feats = number_features(cfg)  # (N, 2P)
        first = len(SPECIAL_TOKENS) + len(WORDS)
        with torch.no_grad():
            tables = [model.model.embed_tokens.weight, model.lm_head.weight]
            for table in {id(t): t for t in tables}.values():
                table[first : first + feats.shape[0], : feats.shape[1]] += feats
    return model.float().eval()


def number_features(cfg: ModelConfig) -> torch.Tensor:
    """(N, 2P) float32: the init features of the N number tokens (see `build_model`)."""
    n = torch.arange(cfg.vocab_size - len(SPECIAL_TOKENS) - len(WORDS), dtype=torch.float64)[:, None]
    angle = 2 * torch.pi * n / torch.tensor(cfg.number_periods, dtype=torch.float64)  # (N, P)
    if 2 * angle.shape[1] > cfg.hidden_size:
        raise ValueError(
            f"ModelConfig: 2·len(number_periods) = {2 * angle.shape[1]} exceeds hidden_size {cfg.hidden_size}"
        )
    return (cfg.number_scale * torch.cat([angle.cos(), angle.sin()], dim=1)).float()


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in model.parameters())


def save_checkpoint(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    path: str | Path,
    meta: dict | None = None,
) -> Path:
    """Write weights (safetensors, float32), config, tokenizer and `meta` (JSON) into folder `path`."""
    from safetensors.torch import save_model

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_model(model.float(), str(path / WEIGHTS_FILE))
    model.config.to_json_file(str(path / CONFIG_FILE))
    tokenizer.backend_tokenizer.save(str(path / TOKENIZER_FILE))
    (path / META_FILE).write_text(json.dumps(meta or {}, indent=2, sort_keys=True) + "\n")
    return path


def load_checkpoint(
    path: str | Path | None = None,
    model: str = "dense",
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast, dict]:
    """(model in eval mode, tokenizer, meta) from a folder written by `save_checkpoint`.

    `path` defaults to the shipped warm start of `model` ("dense": ``data/warmstart``, "moe":
    ``data/warmstart_moe``); the architecture is config.json's `model_type` (Llama or
    Qwen3-MoE). A missing folder or file raises FileNotFoundError and an unreadable one
    ValueError; both name the path and how to rebuild it.
    """
    from safetensors.torch import load_model
    from tokenizers import Tokenizer

    path = Path(path) if path is not None else data_path(WARM_STARTS[model])
    hint = REBUILD_HINT.format(path=path, model=" --model moe" if model == "moe" else "")
    for name in (WEIGHTS_FILE, CONFIG_FILE, TOKENIZER_FILE, META_FILE):
        if not (path / name).is_file():
            raise FileNotFoundError(f"checkpoint {path}: {name} is missing; {hint}")
    try:
        meta = json.loads((path / META_FILE).read_text())
        model_type = json.loads((path / CONFIG_FILE).read_text()).get("model_type")
        if model_type not in ARCHITECTURES:
            raise ValueError(f"config.json model_type {model_type!r} is none of {', '.join(ARCHITECTURES)}")
        config_class, model_class = ARCHITECTURES[model_type]
        config = config_class.from_json_file(str(path / CONFIG_FILE))
        tokenizer = _wrap(Tokenizer.from_file(str(path / TOKENIZER_FILE)))
        policy = model_class(config)
        load_model(policy, str(path / WEIGHTS_FILE), strict=True)
    except Exception as err:  # json, tokenizers and safetensors each raise their own types
        raise ValueError(f"checkpoint {path} is unreadable ({type(err).__name__}: {err}); {hint}") from err
    if len(tokenizer) != config.vocab_size:
        raise ValueError(
            f"checkpoint {path}: tokenizer has {len(tokenizer)} tokens but the model {config.vocab_size}; {hint}"
        )
    return policy.float().eval(), tokenizer, meta
