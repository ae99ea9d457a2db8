"""The CPU example's model, tokenizer, data and reward, built from nothing (no model or dataset
hub): a 2-layer Llama with random weights, a word-level tokenizer with a chat template, and a
parquet dataset in verl's RL format whose task is to repeat a digit.
"""

from __future__ import annotations

from pathlib import Path

# the prompt's words and the numbers 0-99 (the digits to repeat, and the rest of what a random
# model may answer)
WORDS = ["user", "assistant", ":", "please", "repeat", "the", "digit", *map(str, range(100))]
SPECIAL = ["<pad>", "<unk>", "<eos>"]
# the tiny transformer's sizes (2 layers, width 32), shared with the actor-level verl test
TINY = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant : {% endif %}"
)


def build_tokenizer(out: Path):
    """A word-level tokenizer over WORDS, saved to `out` (HF format, with a chat template)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>", chat_template=CHAT_TEMPLATE
    )
    tokenizer.save_pretrained(out)
    return tokenizer


def build_model(out: Path, tokenizer) -> None:
    """A tiny Llama from a config (not Qwen2: transformers 5 loads a Qwen2 model's tokenizer as its
    own BPE class, whatever the tokenizer config says), random weights (seeded), float32, saved as safetensors."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        **TINY,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.eos_token_id
    )
    model.save_pretrained(out, safe_serialization=True)


def build_dataset(path: Path, n: int) -> None:
    """`n` prompts "[please ]*repeat the digit d" (of 3 lengths) in verl's RL format (messages,
    ground truth, data source)."""
    import pandas as pd

    rows = [
        {
            "data_source": "trustlens_repeat_digit",
            "prompt": [{"role": "user", "content": f"{'please ' * (i % 3)}repeat the digit {i % 10}"}],
            "ability": "copy",
            "reward_model": {"style": "rule", "ground_truth": str(i % 10)},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(n)
    ]
    pd.DataFrame(rows).to_parquet(path)


def build(out: Path, prompts: int = 16) -> tuple[Path, Path]:
    """Model and tokenizer in `out`/model, the dataset in `out`/train.parquet."""
    model_dir, data = out / "model", out / "train.parquet"
    model_dir.mkdir(parents=True, exist_ok=True)
    build_model(model_dir, build_tokenizer(model_dir))
    build_dataset(data, prompts)
    return model_dir, data
