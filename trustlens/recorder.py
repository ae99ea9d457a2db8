"""TokenRecorder: the per-token logging hook of a training loop, and its do-nothing twin.

    with TokenRecorder("runs/exp1", rules=["ppo", "dppo_binary_tv"], tokenizer=tok,
                       active_rule="dppo_binary_tv", config=cfg) as rec:
        for step in ...:
            rec.record(step, token_ids=ids, response_mask=mask, pi_logp=pi, mu_logp=mu,
                       old_logp=old, advantages=adv)
            rec.log_metrics(step, {"reward/mean": r})

`record` computes, for every valid (response_mask) position: the ratio π/anchor, the binary TV
and KL, the top-K TV and KL (when π's logits and μ's top-K are given), the entropy of π (from the
logits when not given) and the decision of every evaluated rule (`blocked_<rule>`,
trustlens.rules), and hands the rows to the run's background writer (trustlens.run.background): the
training step does not wait on disk unless the writer's bounded queue is full.

Where the work happens (trustlens.token_rows): the caller's thread checks the arguments (shapes,
types; a bad one raises from `record` and records nothing) while copying the per-token inputs and
token ids into one snapshot, and derives what needs π's logits (entropy, top-K), on the tensors'
device. Checking the values, taking the valid positions and deriving the rest (rule decisions on
the device; ratio and binary divergences from the float32 log-probs with numpy, as the reader
derives them) happen by the caller for accelerator tensors, so that only compact rows leave the
device, and by the writer thread for CPU tensors, so that on a CPU the training step pays only
for the copy (a bad value then raises `RejectedInputError` from the next call: `record`).

The anchor of ratio and divergences is μ. When μ is not given (an external trainer without the
rollout engine's log-probs), they are anchored on π_old, `mu_logp` is null and the manifest
says `"anchor": "old"`. With the default rule set, rules whose inputs are missing (π_old for
`minirl`, top-K for `dppo_topk_*`) get a null `blocked_<rule>` column; the manifest lists what
is missing. Rules asked for by name must be decidable at every call.

When the rollout engine samples at temperature τ, pass `temperature=τ` with π's logits (they are
divided by it) so that π and μ describe the same distribution (docs/rules.md); `pi_logp` and
`old_logp` must come from logits divided by τ too.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from trustlens._checks import check_mask, check_tensor
from trustlens.divergence import entropy_from_logits, topk_divergence
from trustlens.record_args import (
    check_arguments,
    check_tensor_shape,
    check_unique,
    checked_advantages,
    config_dict,
    distributed_rank,
    id_tensor,
    int_arg,
    positive_seconds,
)
from trustlens.rules import RULES, Rule, RuleSpec, require_inputs, resolve_rules
from trustlens.run import blocked_column, signals, table_schema
from trustlens.run.aggregates import Keep
from trustlens.run.background import BackgroundWriter
from trustlens.run.manifest import new_manifest
from trustlens.run.storage import Remote
from trustlens.run.writer import RankWriter, WriterStats
from trustlens.token_rows import (
    Buffers,
    TokenRows,
    check_rows,
    check_token_range,
    derive_rows,
    finish_rows,
    snapshot_token_ids,
    snapshot_values,
    take_rows,
)

# token columns a caller may leave null; the manifest's "missing" lists those never recorded
OPTIONAL_COLUMNS = ("mu_logp", "old_logp", "topk_tv", "topk_kl", "entropy")
# logits are processed in gathered chunks of about this many elements (rows × vocabulary)
LOGIT_CHUNK_ELEMENTS = 1 << 24
# default sample ids: step · SAMPLE_STEP + rank · SAMPLE_RANK + index of the sample in the step
SAMPLE_STEP, SAMPLE_RANK = 10**9, 10**6


class TokenRecorder:
    """Records every generated token of a run into RUN_DIR (docs/run-format.md); see the module
    docstring.

    run_dir: the run directory; created. It may be an object-store URL (`s3://bucket/prefix/run`:
        docs/run-format.md). A directory already holding this rank's rows (or, on
        rank 0, run.json) is refused unless `resume` or `overwrite` is given.
    rules: rules to evaluate per token: names, `Rule`s, or {name: (low, high)} (trustlens.rules);
        `record` then raises when an input one of them needs is missing (π_old for `minirl`, top-K
        for `dppo_topk_*`). Default: every rule of RULES with its default thresholds, each
        decided where the inputs allow it (null `blocked_<rule>` otherwise).
    active_rule: the rule the run trains with (must be among `rules`), for the manifest.
    tokenizer: anything with `decode(list[int]) -> str` (and optionally `batch_decode`); token
        texts are then stored, decoded once per id. None leaves the `token` column null.
    config: the training configuration (a dataclass or a mapping), stored in run.json.
    rows_per_file: token rows per part file (and the bound of the writer's buffer).
    flush_seconds: rows older than this are written even when a part file is not full: the most
        a killed (SIGKILL) run loses. SIGTERM and SIGINT lose nothing.
    queue_size: batches the writer may hold before `record` waits for it.
    rank, world_size: this process's shard of the run. Default: torch.distributed when it is
        initialised, else the RANK / WORLD_SIZE environment, else 0 and 1.
    enabled: False returns a `NullRecorder` (e.g. on tensor-parallel ranks that must not record).
    resume: reopen a run written before (same run_id); steps up to its last recorded step are
        refused. On a directory without a run, starts one.
    overwrite: replace this rank's rows (and, on rank 0, run.json) of a run written before.
    writer_timeout: the most seconds a call waits on the writer (full queue, flush, close)
        before raising WriterError.
    keep: a `Keep` (trustlens.run.aggregates): record every token that matters and a seeded
        random share of the rest, with sampling weights, plus the exact `aggregates` table of
        all tokens (docs/run-format.md). None (default): record every token.
    mirror: stream each step's scalars live to TensorBoard or W&B: "tensorboard:LOGDIR",
        "wandb", "wandb:PROJECT" or a sink object (trustlens.export.mirror; docs/export.md).
        The scalars are those of this rank's rows. None: no mirror.
    """

    def __new__(cls, *args: Any, enabled: bool = True, **kwargs: Any) -> TokenRecorder:
        if not enabled and cls is TokenRecorder:
            return super().__new__(NullRecorder)
        return super().__new__(cls)

    def __init__(
        self,
        run_dir: str | Path,
        *,
        rules: RuleSpec | None = None,
        active_rule: str | None = None,
        tokenizer: Any | None = None,
        config: Any | None = None,
        rows_per_file: int = 262_144,
        flush_seconds: float = 30.0,
        queue_size: int = 8,
        rank: int | None = None,
        world_size: int | None = None,
        enabled: bool = True,
        resume: bool = False,
        overwrite: bool = False,
        writer_timeout: float = 60.0,
        mirror: Any | None = None,
        keep: Keep | None = None,
    ) -> None:
        if keep is not None and not isinstance(keep, Keep):
            raise ValueError(f"keep must be a trustlens.Keep or None, got {keep!r}")
        self.keep = keep
        self._evaluable_cache: dict[tuple, tuple[list[Rule], set[str]]] = {}  # see _evaluable
        self.rules = resolve_rules(list(RULES) if rules is None else rules)
        self._rules_given = rules is not None
        names = [r.name for r in self.rules]
        if active_rule is not None and active_rule not in names:
            raise ValueError(f"active_rule {active_rule!r} is not among the evaluated rules {names}")
        int_arg("rows_per_file", rows_per_file, 1, 2**31)
        queue_size = int_arg("queue_size", queue_size, 1, 2**31)
        # the copies of record calls, reused once their rows are taken: as many sets as can be in
        # flight (the queue's and the one the writer works on), so none is allocated again
        self._buffers = Buffers(keep=queue_size + 1)
        flush_seconds = positive_seconds("flush_seconds", flush_seconds)
        writer_timeout = positive_seconds("writer_timeout", writer_timeout)
        self.rank, self.world_size = distributed_rank(rank, world_size)
        manifest = new_manifest(
            rules={
                r.name: {"low": r.low, "high": r.high, "anchor": r.anchor, "description": r.description}
                for r in self.rules
            },
            active_rule=active_rule,
            config=config_dict(config),
            world_size=self.world_size,
            flush={"rows_per_file": rows_per_file, "flush_seconds": flush_seconds},
        )
        tap = None  # made first: a bad mirror argument fails before the run is opened
        if mirror is not None:
            from trustlens.export.mirror import make_mirror

            tap = make_mirror(mirror)
        rank_writer = RankWriter(
            run_dir,
            rank=self.rank,
            world_size=self.world_size,
            rules=names,
            manifest=manifest if self.rank == 0 else None,
            rows_per_file=rows_per_file,
            tokenizer=tokenizer,
            resume=resume,
            overwrite=overwrite,
        )
        self.path: Path | Remote = rank_writer.path  # a local Path, or an object-store location
        # steps a resumed run may still record: after its last recorded one
        self._first_step = 0 if rank_writer.last_step is None else rank_writer.last_step + 1
        self._writer = BackgroundWriter(
            rank_writer, flush_seconds=flush_seconds, queue_size=queue_size, writer_timeout=writer_timeout, tap=tap
        )
        if keep is not None:  # run.json says the token rows are a sample, and how it was drawn
            self._writer.put_manifest({"keep": dataclasses.asdict(keep)})
        self._anchor: str | None = None
        self._recorded: set[str] = set()  # optional columns recorded at least once
        self._next_sample: dict[tuple[Any, ...], int] = {}  # default sample-id counters
        self._closed = False
        atexit.register(self._at_exit)
        signals.watch(id(self), self._interrupted)

    @property
    def run_id(self) -> str | None:
        """The run's id (run.json `run_id`, kept on resume); None on ranks other than 0."""
        return self._writer.writer.run_id

    # ---- the public API ----

    @property
    def stats(self) -> WriterStats:
        """Rows and files written so far, the writer's peak buffer, time spent waiting on it."""
        return self._writer.stats

    @torch.no_grad()
    def record(
        self,
        step: int,
        *,
        token_ids: torch.Tensor,  # (B, T) int: sampled token ids
        response_mask: torch.Tensor,  # (B, T) bool or 0/1: True at generated tokens to record
        pi_logp: torch.Tensor,  # (B, T) log π(a_t)
        advantages: torch.Tensor,  # (B,) per sequence or (B, T) per token
        mu_logp: torch.Tensor | None = None,  # (B, T) log μ(a_t), the rollout engine's
        old_logp: torch.Tensor | None = None,  # (B, T) log π_old(a_t)
        logits: torch.Tensor | None = None,  # (B, T, V) π's logits, divided by `temperature` here
        mu_topk_ids: torch.Tensor | None = None,  # (B, T, K) μ's top-K ids, sampled id included
        mu_topk_logp: torch.Tensor | None = None,  # (B, T, K) their log μ
        entropy: torch.Tensor | None = None,  # (B, T) entropy of π, nats
        sample_ids: torch.Tensor | Sequence[int] | None = None,  # (B,) unique sample ids
        group_ids: torch.Tensor | Sequence[int] | None = None,  # (B,) prompt-group ids
        update: int = 0,  # minibatch update within the step
        temperature: float = 1.0,  # rollout sampling temperature: logits are divided by it
        topk_tv: torch.Tensor | None = None,  # (B, T) top-K TV already computed (then not from logits)
        topk_kl: torch.Tensor | None = None,  # (B, T) top-K KL(μ‖π) already computed, nats
        blocked: Mapping[str, torch.Tensor] | None = None,  # rule -> (B, T) bool decisions already made
    ) -> int:
        """Record the valid tokens of one batch; returns the number of rows recorded.

        Shapes, types and arguments are checked before anything is queued: a bad one raises
        ValueError (naming the argument and what is wrong) and records nothing. The values
        (NaN, ±inf, log-probabilities > 0, negative divergences, ids outside [0, 2³¹)) are
        checked on the recorder's copy: for accelerator tensors in this call, likewise; for CPU
        tensors by the writer thread, off the training step's path, so that a bad value is found
        after the call returned: that call's rows are dropped (its default sample ids stay
        used) and the next `record`, `log_*`, `flush` or `close` raises `RejectedInputError`
        (a ValueError naming the call's step and update, the argument and the (b, t) index), after
        doing its own work. Default sample ids
        number the samples of (step, update) on this rank in call order:
        step · 10⁹ + rank · 10⁶ + index; default group ids equal the sample ids.

        Precomputed values (computed once by the trainer, e.g. for its loss) skip the recorder's
        own computation: `topk_tv`/`topk_kl` (both or neither) replace the top-K divergence
        from `logits`; `blocked[rule]` replaces the evaluation of that rule (rules not in it are
        evaluated here). They must be what the recorder would compute (same anchor, thresholds
        and temperature); only their shape, type and finiteness are checked.
        """
        self._check_open()
        step = self._step("step", step)
        update = int_arg("update", update, 0, 2**15)
        per_token = {
            "pi_logp": pi_logp,
            "mu_logp": mu_logp,
            "old_logp": old_logp,
            "entropy": entropy,
            "topk_tv": topk_tv,
            "topk_kl": topk_kl,
        }
        shape = check_arguments(token_ids, per_token, mu_topk_ids, mu_topk_logp, temperature)
        if (topk_tv is None) != (topk_kl is None):
            raise ValueError("topk_tv and topk_kl must be given together")
        decided = self._check_blocked(blocked, shape)
        device = pi_logp.device
        given_mask = check_mask("response_mask", response_mask, token_ids)
        mask = self._buffers.empty(tuple(given_mask.shape), torch.bool, device).copy_(given_mask)
        id_key = ("tokens", step, update)
        samples = self._ids("sample_ids", sample_ids, shape[0], device, id_key)
        groups = samples if group_ids is None else self._ids("group_ids", group_ids, shape[0], device, None)
        ids = snapshot_token_ids(token_ids, mask, self._buffers)
        columns = {k: v for k, v in per_token.items() if v is not None}
        per_sequence = None  # (B,) advantages per sequence, checked and copied (not per token: no (B, T) copy)
        if checked_advantages(advantages, shape).dim() == 2:
            columns["advantages"] = advantages
        else:
            per_sequence = check_tensor("advantages", advantages).detach().to(device, copy=True)
        if logits is not None:
            given_topk = topk_tv is not None
            columns.update(
                self._logit_quantities(
                    logits,
                    mask,
                    ids,
                    None if given_topk else mu_topk_ids,
                    None if given_topk else mu_topk_logp,
                    temperature,
                    want_entropy=entropy is None,
                )
            )
        evaluable, recorded = self._evaluable(tuple(columns), tuple(decided))
        rows = TokenRows(
            mask=mask,
            token_ids=ids,
            samples=samples,
            groups=groups,
            names=list(columns),
            values=snapshot_values(columns, mask, self._buffers),
            sequence_advantages=per_sequence,
            decided_rules=list(decided),
            decided=torch.stack([d.to(device) for d in decided.values()]) if decided else None,
            buffers=self._buffers,
            checked=device.type != "cpu",
        )
        if rows.checked:  # an accelerator's rows are checked and taken here
            check_rows(rows)
        self._note_anchor("mu" if mu_logp is not None else "old", recorded)
        n_rows = int(mask.count_nonzero())
        # on the CPU the rows are taken and derived by the writer thread (same device, off the
        # training step's path); elsewhere taken here, so that only compact rows leave the device.
        if device.type == "cpu":
            job = functools.partial(derive_rows, step, update, rows, self.rules, evaluable, self.keep, self.rank)
        else:
            taken = take_rows(step, update, rows, self.rules)
            job = functools.partial(finish_rows, taken, self.rules, evaluable, self.keep, self.rank)
        # last: the writer thread wakes up to it and would compete for the GIL with any torch op after
        self._writer.put_tokens(job)
        if sample_ids is None:
            self._count_ids(id_key, shape[0])
        self._writer.raise_rejected()  # an earlier call's bad input, found by the writer thread
        return n_rows

    def log_metrics(self, step: int, metrics: Mapping[str, float | int | torch.Tensor]) -> None:
        """Record scalar metrics of `step` (long format: one row per name)."""
        self._check_open()
        step = self._step("step", step)
        if not isinstance(metrics, Mapping):
            raise ValueError(f"metrics must be a mapping name -> number, got {type(metrics).__name__}")
        names, values = [], []
        for name, value in metrics.items():
            if not isinstance(name, str):
                raise ValueError(f"metric names must be strings, got {name!r}")
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise ValueError(f"metric {name!r} must be a scalar, got a tensor of shape {tuple(value.shape)}")
                value = value.item()
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                raise ValueError(f"metric {name!r} must be a number, got {value!r}")
            names.append(name)
            values.append(float(value))
        n = len(names)
        batch = pa.RecordBatch.from_pydict(
            {"step": [step] * n, "name": names, "value": values},
            schema=table_schema("metrics"),
        )
        self._writer.put_table("metrics", batch)
        self._writer.raise_rejected()

    def log_samples(
        self,
        step: int,
        *,
        prompts: Sequence[str] | None = None,  # (B,) prompt texts
        responses: Sequence[str] | None = None,  # (B,) response texts
        rewards: Sequence[float] | torch.Tensor | None = None,  # (B,) scalar rewards
        advantages: Sequence[float] | torch.Tensor | None = None,  # (B,) sequence advantages
        lengths: Sequence[int] | torch.Tensor | None = None,  # (B,) response lengths in tokens
        sample_ids: Sequence[int] | torch.Tensor | None = None,  # (B,) ids joining tokens.sample
        group_ids: Sequence[int] | torch.Tensor | None = None,  # (B,) prompt-group ids
    ) -> None:
        """Record one row per sample of `step`. Default sample ids follow `record`'s numbering
        (update 0), so that samples logged in the order they were recorded join their tokens.
        A NaN (or None) reward or advantage is stored as null: the sample has none. Sample ids
        must be unique within the call."""
        self._check_open()
        step = self._step("step", step)
        given = {  # argument -> (column, value)
            "prompts": ("prompt", prompts),
            "responses": ("response", responses),
            "rewards": ("reward", rewards),
            "advantages": ("advantage", advantages),
            "lengths": ("length", lengths),
            "sample_ids": ("sample", sample_ids),
            "group_ids": ("group", group_ids),
        }
        sizes = {}
        for arg, (_, entries) in given.items():
            if entries is None:
                continue
            if isinstance(entries, (str, bytes)) or not hasattr(entries, "__len__"):
                raise ValueError(f"{arg} must be a sequence with one entry per sample, got {type(entries).__name__}")
            sizes[arg] = len(entries)
        if not sizes:
            raise ValueError("log_samples needs at least one of prompts, responses, rewards, advantages, lengths")
        if len(set(sizes.values())) > 1:
            raise ValueError(f"log_samples arguments differ in length: {sizes}")
        n = next(iter(sizes.values()))
        columns: dict[str, Any] = {"step": [step] * n}
        for arg, (name, given_value) in given.items():
            value: Any = given_value.tolist() if isinstance(given_value, (torch.Tensor, np.ndarray)) else given_value
            if name in ("reward", "advantage") and value is not None:
                value = [None if v is None or math.isnan(v) else v for v in value]  # NaN: no value
                bad = [i for i, v in enumerate(value) if v is not None and math.isinf(v)]
                if bad:
                    raise ValueError(f"{arg} holds an infinite value at index {bad[0]}")
            columns[name] = value
        if sample_ids is not None:
            check_unique("sample_ids", columns["sample"])
        default_ids = columns["sample"] is None
        if default_ids:
            start = self._first_id(("samples", step), n)
            columns["sample"] = list(range(start, start + n))
        if columns["group"] is None:
            columns["group"] = columns["sample"]
        try:
            batch = pa.RecordBatch.from_pydict(
                {name: columns.get(name) or [None] * n for name in table_schema("samples").names},
                schema=table_schema("samples"),
            )
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as err:
            raise ValueError(f"log_samples: {err}") from err
        self._writer.put_table("samples", batch)
        if default_ids:
            self._count_ids(("samples", step), n)
        self._writer.raise_rejected()

    def flush(self) -> None:
        """Block until every row recorded so far is in complete part files. Raises the
        RejectedInputError of a call whose input the writer thread found bad (module docstring)."""
        self._check_open()
        self._writer.flush()

    def close(self, error: BaseException | None = None) -> None:
        """Write what is buffered, stop the writer and end the run: `finished`; `interrupted`
        when `error` is a KeyboardInterrupt; `failed` with any other `error`. Raises the
        writer's error if it failed, else (without `error`) the RejectedInputError of a call
        whose rows were dropped. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        signals.unwatch(id(self))
        self._writer.close(error)

    def __enter__(self) -> TokenRecorder:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(exc)

    # ---- internals ----

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"the TokenRecorder of {str(self.path)!r} is closed")
        self._writer.raise_error()

    def _interrupted(self, signal_name: str) -> None:
        """SIGTERM / SIGINT: write every row given so far and end the run `interrupted`."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        self._writer.interrupt(signal_name)

    def _step(self, name: str, step: object) -> int:
        """`step` checked: an integer ≥ 0, after the last step of a resumed run."""
        step = int_arg(name, step, 0, 2**31)
        if step < self._first_step:
            raise ValueError(
                f"{name} {step} was recorded before: this run was resumed after step {self._first_step - 1}"
            )
        return step

    def _check_blocked(self, blocked: object, shape: tuple[int, int]) -> dict[str, torch.Tensor]:
        """The caller's rule decisions {rule: (B, T) bool}, checked."""
        if blocked is None:
            return {}
        if not isinstance(blocked, Mapping):
            raise ValueError(f"blocked must be a mapping rule name -> (B, T) bool tensor, got {type(blocked).__name__}")
        names = [r.name for r in self.rules]
        for rule, decision in blocked.items():
            if rule not in names:
                raise ValueError(f"blocked[{rule!r}]: not an evaluated rule of this recorder ({names})")
            if not isinstance(decision, torch.Tensor) or decision.dtype != torch.bool or tuple(decision.shape) != shape:
                got = (
                    f"{decision.dtype} {tuple(decision.shape)}"
                    if isinstance(decision, torch.Tensor)
                    else type(decision).__name__
                )
                raise ValueError(f"blocked[{rule!r}] must be a bool tensor of shape {shape}, got {got}")
        return dict(blocked)

    def _at_exit(self) -> None:
        """At interpreter exit without close(): keep the rows, and say the run did not close."""
        self.close(RuntimeError("the process exited without TokenRecorder.close()"))

    def _first_id(self, key: tuple[Any, ...], n: int) -> int:
        """The first of the next `n` default sample ids for `key` = (table, step, ...) on this
        rank; `_count_ids` takes them once the call that uses them has passed its checks."""
        start = self._next_sample.get(key, 0)
        if self.rank * SAMPLE_RANK >= SAMPLE_STEP:
            raise ValueError(f"default sample ids cover ranks < {SAMPLE_STEP // SAMPLE_RANK}: pass sample_ids")
        if start + n > SAMPLE_RANK:
            raise ValueError(f"more than {SAMPLE_RANK} samples at step {key[1]}: pass sample_ids")
        return key[1] * SAMPLE_STEP + self.rank * SAMPLE_RANK + start

    def _count_ids(self, key: tuple[Any, ...], n: int) -> None:
        """Take `n` default ids of `key`. Counters of every step are kept (a few bytes per
        step), so that ids stay unique whatever the order of calls across steps."""
        self._next_sample[key] = self._next_sample.get(key, 0) + n

    def _ids(
        self, name: str, ids: object, batch: int, device: torch.device, key: tuple[Any, ...] | None
    ) -> torch.Tensor | int:
        """Per-sample ids (B,) as an int64 tensor on `device`; numbered by default when `key`:
        then the first of the B consecutive ids (the rows' ids are made where they are taken)."""
        if ids is None:
            assert key is not None, "default ids need a counter key"
            return self._first_id(key, batch)
        if not isinstance(ids, torch.Tensor):
            try:
                ids = torch.as_tensor(ids)
            except (TypeError, ValueError, RuntimeError) as err:
                raise ValueError(f"{name} must be a sequence of {batch} integers: {err}") from None
        # a copy: the rows may be derived after record returns, and the caller may reuse `ids`
        ids = id_tensor(name, ids, (batch,)).to(device=device, dtype=torch.int64, copy=True)
        if name == "sample_ids":
            check_unique(name, ids)
        return ids

    def _logit_quantities(self, logits, mask, ids, topk_ids, topk_logp, temperature, *, want_entropy):
        """{"entropy": …, "topk_tv": …, "topk_kl": …} (B, T), 0 in the padding: the entropy (when
        `want_entropy`) and the top-K TV/KL (when μ's top-K is given) at the valid positions, from
        π's logits (B, T, V) gathered a chunk of rows at a time, so that no (N, V) copy is made.
        `ids` (B, T): the sampled ids (checked here against the vocabulary at valid positions)."""
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(mask.shape):
            got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise ValueError(f"logits must be a (B, T, V) tensor with (B, T) = {tuple(mask.shape)}, got {got}")
        if not logits.is_floating_point():
            raise ValueError(f"logits must be a floating-point tensor, got dtype {logits.dtype}")
        vocab = logits.shape[-1]
        check_token_range(ids, mask, vocab, " (the vocabulary of logits)")
        index = torch.nonzero(mask.reshape(-1))[:, 0]  # (N,) the valid positions, flat
        with_topk = topk_ids is not None
        if with_topk:
            k = topk_ids.shape[-1] if isinstance(topk_ids, torch.Tensor) and topk_ids.dim() == 3 else -1
            id_tensor("mu_topk_ids", topk_ids, (*mask.shape, k))
            check_tensor_shape("mu_topk_logp", topk_logp, (*mask.shape, k))
            topk_ids = topk_ids.to(mask.device).reshape(-1, k).index_select(0, index)
            topk_logp = topk_logp.to(mask.device).reshape(-1, k).index_select(0, index)
        wanted = (["entropy"] if want_entropy else []) + (["topk_tv", "topk_kl"] if with_topk else [])
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        out = {name: torch.zeros(mask.numel(), dtype=dtype, device=mask.device) for name in wanted}  # (B·T,)
        flat = logits.reshape(-1, vocab)
        rows = max(1, LOGIT_CHUNK_ELEMENTS // vocab)
        for start in range(0, len(index), rows):
            chunk_index = index[start : start + rows]
            chunk = flat.index_select(0, chunk_index)  # (n, V)
            where = f"at the valid positions from (b, t) = {divmod(int(chunk_index[0]), mask.shape[1])} on"
            if want_entropy:
                bad = torch.isnan(chunk) | (chunk == math.inf)
                if bool(bad.any()):
                    row = int(chunk_index[torch.nonzero(bad.any(-1))[0, 0]])
                    raise ValueError(f"logits hold NaN or +inf at (b, t) = {divmod(row, mask.shape[1])}")
                out["entropy"][chunk_index] = entropy_from_logits(chunk, temperature=temperature).to(dtype)
            if with_topk:
                sl = slice(start, start + rows)
                try:
                    chunk_tv, chunk_kl = topk_divergence(chunk, topk_ids[sl], topk_logp[sl], temperature=temperature)
                except ValueError as err:
                    raise ValueError(f"{err} ({where}; index counted over them)") from err
                out["topk_tv"][chunk_index] = chunk_tv.to(dtype)
                out["topk_kl"][chunk_index] = chunk_kl.to(dtype)
        return {name: t.reshape(mask.shape) for name, t in out.items()}

    def _evaluable(self, columns: tuple[str, ...], decided: tuple[str, ...]) -> tuple[list[Rule], set[str]]:
        """(the rules a call with per-token inputs `columns` and the caller's decisions of the
        rules `decided` can decide, the optional columns and `blocked_<rule>` columns it fills).
        ValueError when a rule the caller asked for needs an input not given. Worked out once
        per (columns, decided)."""
        key = (columns, decided)
        if key not in self._evaluable_cache:
            present = {k: k in columns for k in ("old_logp", "topk_tv", "topk_kl")}
            if self._rules_given:  # the caller asked for these rules: each must be decidable
                for rule in self.rules:
                    require_inputs(rule, present)
            evaluable = [r for r in self.rules if r.name in decided or all(present[a] for a in r.needs)]
            recorded = {k for k in columns if k in OPTIONAL_COLUMNS} | {blocked_column(r.name) for r in evaluable}
            self._evaluable_cache[key] = (evaluable, recorded)
        return self._evaluable_cache[key]

    def _note_anchor(self, anchor: str, recorded: set[str]) -> None:
        """Keep the manifest's anchor and list of missing quantities current; `recorded` holds
        the optional columns (and `blocked_<rule>` columns) this call fills."""
        new_anchor = anchor if self._anchor in (None, anchor) else "mixed"
        if new_anchor == self._anchor and recorded <= self._recorded:
            return
        self._anchor = new_anchor
        self._recorded |= recorded
        wanted = list(OPTIONAL_COLUMNS) + [blocked_column(r.name) for r in self.rules]
        self._writer.put_manifest({"anchor": new_anchor, "missing": [k for k in wanted if k not in self._recorded]})


class NullRecorder(TokenRecorder):
    """TokenRecorder's API doing nothing: swap it in to run without recording, at no cost
    (`TokenRecorder(..., enabled=False)` returns one)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.path = None  # type: ignore[assignment]
        self.rules = []

    @property
    def stats(self) -> WriterStats:
        return WriterStats()

    @property
    def run_id(self) -> str | None:
        return None

    def record(self, *args: Any, **kwargs: Any) -> int:
        return 0

    def log_metrics(self, *args: Any, **kwargs: Any) -> None:
        pass

    def log_samples(self, *args: Any, **kwargs: Any) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self, error: BaseException | None = None) -> None:
        pass

    def __enter__(self) -> NullRecorder:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        pass
