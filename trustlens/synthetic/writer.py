"""Synthetic recorded runs in the exact run format of docs/run-format.md, for tests, demos and benchmarks.

A synthetic run looks like a GRPO/DPPO run on a small vocabulary: long-tailed rollout
log-probabilities μ, π_old = μ plus training-inference mismatch, π moved from π_old by the
update along the advantage, 0/1 rewards with group-normalised advantages, and optionally a
collapse (`collapse_at`). trustlens.synthetic.steps draws the steps and says how each is drawn.

Every derived column (ratio, binary and top-K divergences, `blocked_<rule>`) is computed from
those log-probabilities with trustlens' own functions, so analyses of a synthetic run are
analyses of a consistent run. Rows are generated and written step by step, so a 10M-token run
needs only a few steps of rows in memory.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from trustlens.run.aggregates import Keep
from trustlens.run.manifest import new_manifest
from trustlens.run.parts import Location
from trustlens.run.tables import check_status, rule_entries, write_ranks
from trustlens.synthetic.drift import NO_DRIFT, Drift
from trustlens.synthetic.steps import _check_shape, _Generator, _Shape
from trustlens.synthetic.vocab import HOSTILE_VOCAB, VOCAB

DEFAULT_RULES: tuple[str, ...] = (
    "ppo",
    "ppo_clip_higher",
    "dppo_binary_tv",
    "dppo_binary_kl",
    "dppo_topk_tv",
)


def write_synthetic_run(
    path: str | os.PathLike,
    *,
    steps: int = 20,
    samples_per_step: int = 64,
    seq_len: int = 64,
    rules: Sequence[str] = DEFAULT_RULES,
    seed: int = 0,
    collapse_at: int | None = None,
    group_size: int = 8,
    updates: int = 1,
    world_size: int = 1,
    with_mu: bool = True,
    with_old: bool = True,
    with_topk: bool = True,
    vocab: Sequence[str] = VOCAB,
    active_rule: str | None = None,
    status: str = "finished",
    rows_per_part: int = 1_000_000,
    progress: bool = False,
    keep: Keep | None = None,
    on_step: Callable[[int], object] | None = None,
    drift: Drift | None = None,
) -> Location:
    """Write a synthetic run to `path` (created; must not hold a run already) and return it.

    steps, samples_per_step, seq_len: sizes; responses have 50–100% of `seq_len` tokens, so a run
        holds about 0.75 · steps · samples_per_step · seq_len token rows.
    rules: rules whose `blocked_<rule>` column is evaluated (trustlens.rules).
    collapse_at: step from which a collapse is injected (None: a healthy run).
    group_size: responses per prompt; samples_per_step must be a multiple of it.
    updates: minibatch updates per step; each sample is trained in one of them.
    world_size: ranks; each writes its own part files (a contiguous share of each step's samples).
    with_mu / with_old: False leaves μ (an external trainer's run) / π_old null; the rules are then
        anchored on the other one.
    with_topk: False leaves topk_tv/topk_kl null (no top-K recorded); top-K rules need them.
    vocab: token texts by id, most frequent first (HOSTILE_VOCAB tests untrusted text).
    status: the manifest status (`running` imitates a run still being written).
    rows_per_part: token rows per part file and rank.
    progress: show a progress bar over the steps.
    keep: record a sample of the token rows and the exact aggregates of all, as
        `TokenRecorder(keep=...)` does (trustlens.run.aggregates); None keeps every row.
    drift: the slow healthy drift of a long run (trustlens.synthetic.drift.Drift: warm-up,
        entropy decline, grad-norm decay, mismatch drift, held-out evaluations); run.json records
        its `warmup_steps`, `eval_size` and config `drift`. None: none.
    on_step: called with each step once its rows are handed to the writer (in part files when
        `rows_per_part` is below a step's rows): e.g. a pause that makes the run one being
        trained, for following it live (trustlens.run.follow).
    """
    shape = _Shape(steps, samples_per_step, seq_len, group_size, updates, world_size)
    rules = list(rules)
    _check_args(shape, with_mu, with_old, collapse_at, vocab, status, rules, active_rule)
    present = {"mu_logp": with_mu, "old_logp": with_old, "topk_tv": with_topk, "topk_kl": with_topk}
    manifest = _manifest(shape, seed, collapse_at, present, rules, active_rule, keep, drift)
    rng, drawn = np.random.default_rng(seed), NO_DRIFT if drift is None else drift
    gen = _Generator(shape, rng, list(vocab), rules, collapse_at, with_mu, with_old, with_topk, drawn)
    return write_ranks(
        path,
        _step_tables(gen, steps, progress, on_step),
        world_size=world_size,
        rules=rules,
        manifest=manifest,
        rows_per_part=rows_per_part,
        status=status,
        keep=keep,
        tokenizer=_Vocab(vocab),
    )


def _check_args(
    shape: _Shape,
    with_mu: bool,
    with_old: bool,
    collapse_at: int | None,
    vocab: Sequence[str],
    status: str,
    rules: list[str],
    active_rule: str | None,
) -> None:
    """ValueError naming the first bad argument of `write_synthetic_run`, before anything is written."""
    _check_shape(shape)
    if not with_mu and not with_old:
        raise ValueError("with_mu and with_old are both False: a run needs μ or π_old as its anchor")
    if collapse_at is not None and not 0 <= collapse_at < shape.steps:
        raise ValueError(f"collapse_at must be a step in [0, {shape.steps}), got {collapse_at}")
    if len(vocab) < 2:
        raise ValueError(f"vocab must hold at least 2 token texts, got {len(vocab)}")
    check_status(status)
    rule_entries(rules)  # unknown rules fail before anything is written
    if active_rule is not None and active_rule not in rules:
        raise ValueError(f"active_rule {active_rule!r} is not among rules {rules}")


def _step_tables(
    gen: _Generator, steps: int, progress: bool, on_step: Callable[[int], object] | None
) -> Iterator[dict[str, pa.Table]]:
    """Each step's tables in turn (a progress bar over the steps with `progress`); `on_step` is
    called with each step once the writer took its rows."""
    step_iter: Iterable[int] = range(steps)
    if progress:
        from tqdm import tqdm

        step_iter = tqdm(step_iter, desc="synthetic run", unit="step")
    for step in step_iter:
        yield gen.step(step)  # the writer takes this step's rows before asking for the next
        if on_step is not None:
            on_step(step)


def _manifest(
    shape: _Shape,
    seed: int,
    collapse_at: int | None,
    present: dict[str, bool],  # token column -> whether the run records it
    rules: list[str],
    active_rule: str | None,
    keep: Keep | None,
    drift: Drift | None,
) -> dict:
    """run.json of a synthetic run (config "source": "synthetic"), with its Keep and Drift."""
    config = {
        "source": "synthetic",
        "steps": shape.steps,
        "samples_per_step": shape.samples_per_step,
        "seq_len": shape.seq_len,
        "group_size": shape.group_size,
        "updates": shape.updates,
        "seed": seed,
        "collapse_at": collapse_at,
        "with_mu": present["mu_logp"],
        "with_old": present["old_logp"],
        "with_topk": present["topk_tv"],
    }
    manifest = new_manifest(
        rules=rule_entries(rules),
        active_rule=active_rule or (rules[0] if rules else None),
        config=config,
        world_size=shape.world_size,
        anchor="mu" if present["mu_logp"] else "old",
        missing=[name for name, given in present.items() if not given],
    )
    if keep is not None:
        if not isinstance(keep, Keep):
            raise ValueError(f"keep must be a trustlens.Keep or None, got {keep!r}")
        manifest["keep"] = dataclasses.asdict(keep)
    if drift is not None:
        if not isinstance(drift, Drift):
            raise ValueError(f"drift must be a trustlens.synthetic.Drift or None, got {drift!r}")
        manifest["config"]["drift"] = dataclasses.asdict(drift)
        manifest["warmup_steps"] = drift.warmup_steps
        manifest["eval_size"] = drift.eval_size
    return manifest


class _Vocab:
    """Decodes a synthetic run's token ids: id i is `vocab[i]` (a tokenizer for the run writer)."""

    def __init__(self, vocab: Sequence[str]) -> None:
        self.vocab = list(vocab)

    def batch_decode(self, ids: list[list[int]]) -> list[str]:
        return [self.vocab[i[0]] for i in ids]


def expected_token_rows(steps: int, samples_per_step: int, seq_len: int) -> int:
    """The expected number of token rows of a synthetic run of these sizes (lengths ~ U[L/2, L])."""
    lo = max(1, seq_len // 2)
    return round(steps * samples_per_step * (lo + seq_len) / 2)


__all__ = [
    "DEFAULT_RULES",
    "HOSTILE_VOCAB",
    "VOCAB",
    "expected_token_rows",
    "write_synthetic_run",
]
