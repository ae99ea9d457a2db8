import json
import subprocess
import sys

import pytest
import torch

from trustlens.cli import main
from trustlens.train.model import ModelConfig, build_model, build_tokenizer, load_checkpoint
from trustlens.train.tasks import ArithmeticTask, Problem
from trustlens.train.warmup import IGNORE, WarmupConfig, batch_tensors, evaluate, warmup, with_paths

TOK = build_tokenizer()
TINY = WarmupConfig(
    max_steps=6,
    batch_size=8,
    eval_every=3,
    eval_size=8,
    final_eval_size=8,
    model=ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64),
)


def test_batch_labels_score_only_the_response():
    p = Problem.from_numbers((12, 47, 8), ("+", "+"))
    ids, mask, labels = batch_tensors(TOK, [p])
    assert TOK.decode(ids[0]) == "<bos> 12 + 47 + 8 = " + p.target + " <eos>"
    assert mask.all()
    scored = labels[0][labels[0] != IGNORE]
    assert TOK.decode(scored) == p.target + " <eos>"
    assert (labels[0, :7] == IGNORE).all()  # <bos> and the 6 prompt words


class _Oracle(torch.nn.Module):
    """A stand-in model whose generate() writes the right scratchpad (or a wrong answer)."""

    def __init__(self, problems, wrong_every=0):
        super().__init__()
        self.by_prompt = {tuple(TOK(p.prompt).input_ids): p for p in problems}
        self.wrong_every = wrong_every

    def generate(self, input_ids, attention_mask, max_new_tokens, **kw):
        rows = []
        for i, row in enumerate(input_ids.tolist()):
            p = self.by_prompt[tuple(row)]
            text = p.target if not self.wrong_every or i % self.wrong_every else f"answer {p.answer + 1}"
            rows.append(row + TOK(text + " <eos>", add_special_tokens=False).input_ids)
        width = max(map(len, rows))
        return torch.tensor([r + [TOK.pad_token_id] * (width - len(r)) for r in rows])


def test_evaluate_counts_right_answers():
    task = ArithmeticTask()
    problems = task.eval_set(12, seed=3)
    assert evaluate(_Oracle(problems), TOK, task, problems, batch_size=5) == 1.0
    assert evaluate(_Oracle(problems, wrong_every=4), TOK, task, problems, batch_size=12) == 0.75


def test_evaluate_sampling_is_seeded_and_leaves_global_rng():
    task = ArithmeticTask()
    model = build_model(TINY.model, seed=0)
    problems = task.eval_set(4, seed=0)
    torch.manual_seed(7)
    before = torch.rand(1)
    torch.manual_seed(7)
    a = evaluate(model, TOK, task, problems, temperature=1.0, seed=1)
    assert torch.equal(torch.rand(1), before)
    assert a == evaluate(model, TOK, task, problems, temperature=1.0, seed=1)


def test_warmup_is_deterministic(tmp_path):
    _, _, meta_a = warmup(TINY, tmp_path / "a", progress=False)
    _, _, meta_b = warmup(TINY, tmp_path / "b", progress=False)
    a, _, _ = load_checkpoint(tmp_path / "a")
    b, _, _ = load_checkpoint(tmp_path / "b")
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert meta_a["history"] == meta_b["history"] and meta_a["steps"] == 6
    assert [h["step"] for h in meta_a["history"]] == [3, 6]
    assert meta_a["config"]["model"]["hidden_size"] == 32
    fresh = build_model(TINY.model, seed=0).state_dict()
    assert not all(torch.equal(fresh[k], sa[k]) for k in sa)  # it did train


def test_warmup_stops_at_first_check_reaching_target():
    cfg = WarmupConfig(**{**TINY.__dict__, "target_accuracy": 0.0})
    _, _, meta = warmup(cfg, None, progress=False)
    assert meta["steps"] == 3 and meta["reached_target"]


def test_cli_warmup(tmp_path, capsys):
    out = tmp_path / "ck"
    args = [
        "warmup",
        "--out",
        str(out),
        "--max-steps",
        "2",
        "--batch-size",
        "4",
        "--eval-every",
        "2",
        "--eval-size",
        "4",
        "--final-eval-size",
        "4",
        "--quiet",
    ]
    assert main(args) == 0
    assert "wrote" in capsys.readouterr().out
    _, _, meta = load_checkpoint(out)
    assert meta["steps"] == 2 and meta["config"]["batch_size"] == 4


@pytest.mark.parametrize(
    "flag, value", [("--max-steps", "0"), ("--target-accuracy", "1.5"), ("--lr", "-1"), ("--threads", "0")]
)
def test_cli_bad_flags(tmp_path, capsys, flag, value):
    assert main(["warmup", "--out", str(tmp_path), flag, value]) == 2
    assert flag in capsys.readouterr().err


def test_cli_help_documents_every_flag(capsys):
    # in-process, as test_train_cli's help test (a `python -m trustlens.cli` process only adds its
    # start-up; the torchrun tests run that entry point)
    with pytest.raises(SystemExit) as exit_:
        main(["warmup", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--out",
        "--seed",
        "--max-steps",
        "--batch-size",
        "--lr",
        "--target-accuracy",
        "--alt-share",
        "--eval-every",
        "--eval-size",
        "--final-eval-size",
        "--threads",
        "--quiet",
    ):
        assert flag in out


def test_shipped_checkpoint_is_mediocre():
    model, tok, meta = load_checkpoint()
    assert len(tok) == model.config.vocab_size == ModelConfig().vocab_size
    assert 1_000_000 <= sum(p.numel() for p in model.parameters()) <= 5_000_000
    assert 0.2 <= meta["accuracy_greedy"] <= 0.5
    assert meta["accuracy_sampled_t1"] < meta["accuracy_greedy"] + 0.05
    task = ArithmeticTask(**meta["config"]["task"])
    assert task == ArithmeticTask()
    # the recorded accuracy is reproducible from the shipped weights (the first 200 eval problems)
    problems = task.eval_set(meta["eval"]["problems"], seed=meta["eval"]["eval_set_seed"])[:200]
    assert abs(evaluate(model, tok, task, problems) - meta["accuracy_greedy"]) < 0.12
    json.dumps(meta)


@pytest.mark.slow
def test_rebuild_reproduces_the_shipped_checkpoint(tmp_path):
    """`trustlens warmup` with its defaults rebuilds data/warmstart bit for bit (checked with torch
    2.13 CPU on x86-64; other kernels may round differently)."""
    from trustlens.paths import data_path

    subprocess.run([sys.executable, "-m", "trustlens.cli", "warmup", "--out", str(tmp_path), "--quiet"], check=True)
    shipped = data_path("warmstart")
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes(), name
    ours, theirs = (json.loads((d / "meta.json").read_text()) for d in (tmp_path, shipped))
    ours.pop("train_seconds"), theirs.pop("train_seconds")
    assert ours == theirs


def test_with_paths_writes_other_valid_paths_at_the_given_share():
    task = ArithmeticTask()
    problems = task.sample(2000, 0)
    out = with_paths(problems, 0.1, torch.Generator().manual_seed(0))
    moved = [q for p, q in zip(problems, out, strict=True) if q.target != p.target]
    assert 0.08 < len(moved) / len(problems) < 0.12  # problems with one path only stay put
    for q in moved:
        assert q.target in q.solutions()[1:] and task.reward(q, q.target) == 1.0
    assert with_paths(problems, 0.0, torch.Generator().manual_seed(0)) == problems
    with pytest.raises(ValueError, match="alt_share"):
        with_paths(problems, 1.5, torch.Generator())
