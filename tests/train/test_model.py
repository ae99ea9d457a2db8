import json

import pytest
import torch

from trustlens.train.model import (
    MAX_NUMBER,
    ModelConfig,
    build_model,
    build_tokenizer,
    count_parameters,
    load_checkpoint,
    save_checkpoint,
)
from trustlens.train.tasks import ArithmeticTask

TOK = build_tokenizer()
SMALL = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def test_tokenizer_vocabulary_and_special_ids():
    assert len(TOK) == ModelConfig().vocab_size >= 1000
    assert (TOK.pad_token_id, TOK.bos_token_id, TOK.eos_token_id, TOK.unk_token_id) == (0, 1, 2, 3)
    assert build_tokenizer().get_vocab() == TOK.get_vocab()


@pytest.mark.parametrize("n", [0, 7, 59, 100, 297, MAX_NUMBER])
def test_numbers_are_single_tokens(n):
    ids = TOK(str(n), add_special_tokens=False).input_ids
    assert len(ids) == 1
    assert TOK.convert_ids_to_tokens(ids) == [str(n)]
    assert TOK.decode(ids) == str(n)


def test_round_trip_of_task_text():
    for p in ArithmeticTask().sample(50, 0):
        text = p.prompt + " " + p.target
        ids = TOK(text).input_ids
        assert ids[0] == TOK.bos_token_id
        assert len(ids) == 1 + len(text.split())
        assert TOK.unk_token_id not in ids
        assert TOK.decode(ids, skip_special_tokens=True) == text
    assert TOK.decode([TOK.convert_tokens_to_ids("5"), TOK.eos_token_id]) == "5 <eos>"


def test_unknown_words_map_to_unk():
    assert TOK("1000 / x", add_special_tokens=False).input_ids == [TOK.unk_token_id] * 3


def test_default_model_size():
    n = count_parameters(build_model(ModelConfig(), seed=0))
    assert 1_000_000 <= n <= 5_000_000


def test_build_model_deterministic_and_keeps_global_rng():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_model(SMALL, seed=1)
    assert torch.equal(torch.rand(1), before)
    b = build_model(SMALL, seed=1)
    c = build_model(SMALL, seed=2)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


@pytest.mark.parametrize("tie", [False, True])
def test_save_load_round_trip(tmp_path, tie):
    cfg = ModelConfig(**{**SMALL.__dict__, "tie_embeddings": tie})
    model = build_model(cfg, seed=3)
    save_checkpoint(model, TOK, tmp_path / "ck", {"accuracy": 0.3})
    loaded, tok, meta = load_checkpoint(tmp_path / "ck")
    assert meta == {"accuracy": 0.3}
    assert tok.get_vocab() == TOK.get_vocab() and tok.eos_token_id == TOK.eos_token_id
    sd, ld = model.state_dict(), loaded.state_dict()
    assert sd.keys() == ld.keys() and all(torch.equal(sd[k], ld[k]) for k in sd)
    x = torch.randint(0, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(x).logits, loaded(x).logits)


def test_missing_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere.*trustlens warmup --out"):
        load_checkpoint(tmp_path / "nowhere")


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer.json", "meta.json"])
def test_corrupt_checkpoint(tmp_path, name):
    save_checkpoint(build_model(SMALL), TOK, tmp_path, {})
    (tmp_path / name).write_bytes(b"\x00garbage")
    with pytest.raises(ValueError, match=r"unreadable.*trustlens warmup --out"):
        load_checkpoint(tmp_path)


def test_checkpoint_with_wrong_shapes(tmp_path):
    save_checkpoint(build_model(SMALL), TOK, tmp_path, {})
    other = ModelConfig(**{**SMALL.__dict__, "hidden_size": 16, "num_heads": 1})
    (tmp_path / "config.json").write_text(json.dumps(other.to_llama().to_dict()))
    with pytest.raises(ValueError, match="unreadable"):
        load_checkpoint(tmp_path)
