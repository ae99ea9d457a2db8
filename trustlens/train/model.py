"""The tiny policy model of the built-in run: a word-level tokenizer and a Llama-style causal LM.

Tokenizer: one token per integer 0..`max_number`, the operators, ``=``, ``;``, ``answer`` and the
special tokens ``<pad> <bos> <eos> <unk>``; words are whitespace-separated and encoding a text
prepends ``<bos>``. It is built in code (nothing is downloaded) and is the same on every machine.

Checkpoint: a folder with ``model.safetensors`` (weights, float32), ``config.json`` (the
transformers LlamaConfig), ``tokenizer.json`` and ``meta.json`` (how it was made, its held-out
accuracy). `load_checkpoint()` without a path loads the shipped warm start, ``data/warmstart``,
which ``trustlens warmup`` rebuilds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from trustlens.paths import data_path

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")  # ids 0..3, in this order
WORDS = ("+", "-", "*", "=", ";", "answer")  # the non-number words of the task
MAX_NUMBER = 999  # the largest integer with its own token

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
META_FILE = "meta.json"
REBUILD_HINT = "rebuild it with `trustlens warmup --out {path}`"


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
    """Size of the policy model (a transformers Llama); the defaults give 1.11M parameters."""

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

    def to_llama(self) -> LlamaConfig:
        """The equivalent transformers LlamaConfig (special-token ids of `build_tokenizer`)."""
        return LlamaConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_heads,
            intermediate_size=self.intermediate_size,
            max_position_embeddings=self.max_positions,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            tie_word_embeddings=self.tie_embeddings,
            pad_token_id=SPECIAL_TOKENS.index("<pad>"),
            bos_token_id=SPECIAL_TOKENS.index("<bos>"),
            eos_token_id=SPECIAL_TOKENS.index("<eos>"),
            attention_dropout=0.0,
        )


def build_model(cfg: ModelConfig = ModelConfig(), seed: int = 0) -> LlamaForCausalLM:
    """A freshly initialised float32 model; the same weights for the same (cfg, seed).

    The input and output embedding rows of the number tokens start as random init plus
    ``number_scale · [cos(2πn/P), sin(2πn/P) for P in number_periods]`` in their first
    2·len(number_periods) dimensions, n being the token's value: a number line with periodic
    structure, like the one pretrained LLMs learn for numbers, as a head start for the warm-up.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg.to_llama())
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
    model: LlamaForCausalLM,
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
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast, dict]:
    """(model in eval mode, tokenizer, meta) from a folder written by `save_checkpoint`.

    `path` defaults to the shipped warm start ``data/warmstart``. A missing folder or file raises
    FileNotFoundError and an unreadable one ValueError; both name the path and how to rebuild it.
    """
    from safetensors.torch import load_model
    from tokenizers import Tokenizer

    path = Path(path) if path is not None else data_path("warmstart")
    hint = REBUILD_HINT.format(path=path)
    for name in (WEIGHTS_FILE, CONFIG_FILE, TOKENIZER_FILE, META_FILE):
        if not (path / name).is_file():
            raise FileNotFoundError(f"checkpoint {path}: {name} is missing; {hint}")
    try:
        meta = json.loads((path / META_FILE).read_text())
        config = LlamaConfig.from_json_file(str(path / CONFIG_FILE))
        tokenizer = _wrap(Tokenizer.from_file(str(path / TOKENIZER_FILE)))
        model = LlamaForCausalLM(config)
        load_model(model, str(path / WEIGHTS_FILE), strict=True)
    except Exception as err:  # json, tokenizers and safetensors each raise their own types
        raise ValueError(f"checkpoint {path} is unreadable ({type(err).__name__}: {err}); {hint}") from err
    if len(tokenizer) != config.vocab_size:
        raise ValueError(
            f"checkpoint {path}: tokenizer has {len(tokenizer)} tokens but the model {config.vocab_size}; {hint}"
        )
    return model.float().eval(), tokenizer, meta
