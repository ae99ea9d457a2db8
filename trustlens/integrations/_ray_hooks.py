"""What the hooks of the Ray trainers (trustlens.integrations.verl and .openrlhf) share: the run
directory from the environment, the sample ids the driver gives each row of a step and sends to
the workers, the rule set an external trainer can feed, one worker's recorder with its step /
update bookkeeping, and the driver's end of the run.

Ranks of a run recorded from a Ray trainer: rank 0 is the driver (samples, metrics, run.json and
its final status); the training worker of data-parallel rank r writes its tokens as rank r + 1.

Steps: the driver's step, sent to the workers with the batch (`STEP_KEY`); a worker that gets
none counts its own training steps from 1.

Sample ids: the driver sees every sample of a step, so it numbers them (`sample_ids`): a 62-bit
hash of the sample's valid token ids (prompt and response), identical (prompt, response) pairs of
the step told apart by their order. It records its samples rows under these ids and sends each
row's id to the workers with the training batch (`SAMPLE_KEY`: verl, a per-row field of the batch;
OpenRLHF, an entry of each experience's `info`); a worker records its rows under the ids they
came with, so tokens and samples join on (step, sample) whichever worker trained a row.

A worker whose rows came without ids (a driver that is not hooked, or a trainer path that drops
the field) falls back to the same content hash of each row, repeats numbered only within one
micro-batch. That fallback cannot tell identical (prompt, response) pairs of one step apart when
they are trained on different workers or in different micro-batches: they share the first id,
so two ranks write rows under one (step, update, sample) and the other copy's samples row has
no tokens (on one worker the later copy is taken for a re-run and dropped).

A row a worker meets again in a later micro-batch of the same update (a re-run micro-batch: same
id) is recorded once. The group id is the hash of the prompt.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

import torch

from trustlens.integrations.active_rule import ActiveRule
from trustlens.record import TokenRecorder
from trustlens.rules import RULES, Rule

# the environment variable naming the run directory of an attached trainer
ENV_DIR = "TRUSTLENS_DIR"
# what the driver sends the workers with a training batch: its step, and each row's sample id
STEP_KEY, SAMPLE_KEY = "trustlens_step", "trustlens_sample"
# inputs an external trainer cannot feed (`Rule.needs`): it keeps no top-K of μ
_TOPK_INPUTS = {"topk_tv", "topk_kl"}
_HASH_BITS = (1 << 62) - 1


def driver_alerts(recorder: Any, step: int, metrics: dict) -> dict:
    """After the driver logged `step`'s metrics: tell its recorder the step ended (its live
    alerts judge it) and return `metrics` with the alerts so far as `trustlens/alert/...`
    numbers (trustlens.live.alert_metrics), for the framework's own logged metrics."""
    from trustlens.live import alert_metrics

    recorder.end_step(step)
    return {**metrics, **alert_metrics(recorder.live_alerts)}


def run_dir_from_env() -> str | None:
    """The run directory named by TRUSTLENS_DIR, or None (recording off) when it is unset or empty."""
    return os.environ.get(ENV_DIR) or None


def content_id(tokens: torch.Tensor, salt: int = 0) -> int:
    """A 62-bit id of a 1-D integer token tensor (and `salt`): the same on every process."""
    data = tokens.detach().to("cpu", torch.int64).contiguous().numpy().tobytes()
    digest = hashlib.blake2b(data + salt.to_bytes(4, "little"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _HASH_BITS


def sample_ids(sequences: Iterable[torch.Tensor], prompt_lengths: Iterable[int]) -> tuple[list[int], list[int]]:
    """(sample ids, group ids) of `sequences` (each the 1-D valid token ids of prompt and response,
    whose first `prompt_lengths` tokens are the prompt). Repeats of one sequence within the call
    are numbered in order: call it once on all the samples of a step."""
    seen: dict[int, int] = {}
    samples, groups = [], []
    for seq, n_prompt in zip(sequences, prompt_lengths, strict=True):
        base = content_id(seq)
        repeat = seen.get(base, 0)
        seen[base] = repeat + 1
        samples.append(base if repeat == 0 else content_id(seq, repeat))
        groups.append(content_id(seq[: int(n_prompt)]))
    return samples, groups


def id_list(ids: Any) -> list[int] | None:
    """Sample ids sent with a batch (a tensor, or a list of 0-d tensors or ints) as ints; None if absent."""
    if ids is None:
        return None
    if isinstance(ids, torch.Tensor):
        ids = ids.reshape(-1)
    return [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]


def padded_sequences(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int):
    """Per row of a left/right-padded batch (B, P + R): its valid token ids and prompt length."""
    mask = attention_mask.bool()
    seqs = [row[m] for row, m in zip(input_ids, mask, strict=True)]
    prompt_lengths = (mask[:, : mask.shape[1] - response_len].sum(1)).tolist()
    return seqs, prompt_lengths


def sample_columns(
    tokenizer: Any,
    sequences: list[torch.Tensor],
    prompt_lengths: list[int],
    responses: torch.Tensor,  # (B, T) response token ids
    mask: torch.Tensor,  # (B, T) bool: the response tokens trained on
    advantages: torch.Tensor,  # (B, T) per-token advantages
    ids: tuple[list[int], list[int]] | None = None,  # (sample ids, group ids) when numbered already
) -> dict[str, Any]:
    """TokenRecorder.log_samples arguments of a batch (but step and rewards): prompt and response
    text, the mean advantage over the response, its length and the ids (`ids`, else `sample_ids`
    of the batch)."""
    samples, groups = sample_ids(sequences, prompt_lengths) if ids is None else ids
    decode = functools.partial(tokenizer.decode, skip_special_tokens=True)
    return {
        "prompts": [decode(s[:n].tolist()) for s, n in zip(sequences, prompt_lengths, strict=True)],
        "responses": [decode(r[m].tolist()) for r, m in zip(responses, mask, strict=True)],
        "advantages": (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1),
        "lengths": mask.sum(-1),
        "sample_ids": samples,
        "group_ids": groups,
    }


def external_rules(active: ActiveRule, fields: Mapping[str, Any] | None = None) -> list[Rule]:
    """Every rule an external trainer can feed (all but the top-K ones), with the active rule's
    thresholds set to the trainer's own, and its other `fields` (a batch rule's cov_ratio, ...)."""
    rules = [rule for rule in RULES.values() if not _TOPK_INPUTS & set(rule.needs)]
    if active.name is None:
        return rules
    return [
        replace(r.with_thresholds(low=active.low, high=active.high), **(fields or {})) if r.name == active.name else r
        for r in rules
    ]


class WorkerRecording:
    """One training worker's recorder (opened on first use) with its step, update and dedup state.

    The trainer calls `begin_step` at each policy update call (one training step), `next_update`
    after each optimizer step, and `record` per micro-batch with the sample ids its rows came with
    (else their content ids); rows of a (step, update, sample) this worker already recorded (a
    re-run micro-batch) are dropped.
    """

    def __init__(self, rank: int, world_size: int, rules: list[Rule], active_rule: str | None) -> None:
        self.rank, self.world_size = rank, world_size  # trustlens rank (data-parallel rank + 1)
        self.rules, self.active_rule = rules, active_rule
        self.step, self.update = 0, 0
        self._done: set[tuple[int, int, int]] = set()
        self._recorder: TokenRecorder | None = None

    def recorder(self, run_dir: str) -> TokenRecorder:
        if self._recorder is None:
            self._recorder = TokenRecorder(
                run_dir,
                rules=self.rules,
                active_rule=self.active_rule,
                rank=self.rank,
                world_size=self.world_size,
            )
        return self._recorder

    def begin_step(self, step: int | None) -> None:
        """Start a training step: `step` from the driver when it said, else the next one."""
        self.step = self.step + 1 if step is None else int(step)
        self.update = 0
        self._done = set()

    def next_update(self) -> None:
        self.update += 1
        if self._recorder is not None:
            self._recorder.flush()  # Ray may kill a worker without notice: keep what is recorded

    def record(
        self,
        run_dir: str,
        sequences: list[torch.Tensor],
        prompt_lengths: list[int],
        ids: list[int] | None = None,
        **tensors: Any,
    ) -> int:
        """Record one micro-batch: `tensors` are TokenRecorder.record's (B, T) arguments, `ids` the
        rows' sample ids from the driver (None: their content ids, see the module's docstring)."""
        if ids is None:
            samples, groups = sample_ids(sequences, prompt_lengths)
        elif len(ids) != len(sequences):
            raise ValueError(f"{len(ids)} sample ids came with a micro-batch of {len(sequences)} rows")
        else:
            samples = list(ids)
            groups = [content_id(seq[: int(n)]) for seq, n in zip(sequences, prompt_lengths, strict=True)]
        keep = [(self.step, self.update, s) not in self._done for s in samples]
        mask = tensors.pop("response_mask").bool() & torch.tensor(keep, device=tensors["token_ids"].device)[:, None]
        self._done.update((self.step, self.update, s) for s in samples)
        return self.recorder(run_dir).record(
            self.step, update=self.update, response_mask=mask, sample_ids=samples, group_ids=groups, **tensors
        )

    def close(self) -> None:
        if self._recorder is not None:
            self._recorder.close()


def finish(state: dict[str, Any], error: BaseException | None) -> None:
    """Close the driver's recorder `state["driver"]`: run.json says finished, or failed (or
    interrupted) with `error`."""
    if state["driver"] is not None:
        state["driver"].close(error)
        state["driver"] = None


def finishing(state: dict[str, Any], fit: Any, *args: Any, **kwargs: Any) -> Any:
    """`fit(*args, **kwargs)` (a trainer's training loop), then `finish` the run: finished when it
    returns, failed (the error re-raised) when it raises."""
    try:
        out = fit(*args, **kwargs)
    except BaseException as err:
        finish(state, err)
        raise
    finish(state, None)
    return out


def closing_run(fit: Any, state: dict[str, Any]) -> Any:
    """`fit` (a trainer's training loop method) wrapped to `finish` the run when it returns or raises."""

    @functools.wraps(fit)
    def hooked_fit(self, *args, **kwargs):
        return finishing(state, fit, self, *args, **kwargs)

    return hooked_fit


def numeric_metrics(metrics: Mapping[str, Any], prefix: str) -> dict[str, float]:
    """The finite scalar numbers of `metrics`, named `prefix + name`; others are left out."""
    out = {}
    for name, value in metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if hasattr(value, "item") and getattr(value, "size", 2) == 1:
            value = value.item()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(float(value)) < float("inf"):
            out[prefix + str(name)] = float(value)
    return out
