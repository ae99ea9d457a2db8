"""TokenRecorder, the per-token logging hook of a training loop (overview and example:
trustlens.record, where it is imported from).

The class holds a run's open writer and the state its calls share and orders each call's work:
arguments checked, inputs copied and π's logit quantities derived in the caller's thread, then
the rows handed to the background writer. The pieces: trustlens.record.args (argument checks),
trustlens.record.token_rows (the rows of a `record` call; trustlens.record.staged_rows on an
accelerator), trustlens.record.logit_quantities (entropy and top-K divergences from π's logits),
trustlens.record.recorded_columns (which rules a call decides, the manifest's anchor and missing columns),
trustlens.record.sample_ids (sample and group ids), trustlens.record.logged_rows (the rows of
`log_metrics`, `log_samples`), trustlens.record.calls (the other calls: `RecorderCalls`).
"""

from __future__ import annotations

import atexit
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from trustlens.core.tensor_checks import check_mask
from trustlens.record.args import check_tokenizer_answer, int_arg
from trustlens.record.call_inputs import CallSnapshot, checked_inputs, snapshot_call
from trustlens.record.calls import RecorderCalls
from trustlens.record.options import live_taps, open_writer, recorder_options
from trustlens.record.recorded_columns import RecordedColumns
from trustlens.record.sample_ids import SampleIds
from trustlens.record.staged_rows import derive_staged, stage_rows
from trustlens.record.token_rows import Buffers, derive_rows, snapshot_token_ids
from trustlens.rules import RuleSpec
from trustlens.run import interrupts
from trustlens.run.aggregates import Keep
from trustlens.run.parts import check_resumed_rules
from trustlens.run.storage import Remote
from trustlens.run.writer import WriterStats


class TokenRecorder(RecorderCalls):
    """Records every generated token of a run into RUN_DIR (docs/run-format.md); see the
    docstring of trustlens.record.

    run_dir: the run directory; created. It may be an object-store URL (`s3://bucket/prefix/run`:
        docs/run-format.md). A directory already holding this rank's rows (or, on
        rank 0, run.json) is refused unless `resume` or `overwrite` is given.
    rules: rules to evaluate per token: names, `Rule`s, or {name: (low, high)} (trustlens.rules);
        `record` then raises when an input one of them needs is missing (π_old for `minirl`, top-K
        for `dppo_topk_*`). Default: every rule of RULES with its default thresholds, each
        decided where the inputs allow it (null `blocked_<rule>` otherwise).
    active_rule: the rule the run trains with (must be among `rules`), for the manifest and `keep`.
    tokenizer: anything with `decode(list[int]) -> str` (and optionally `batch_decode`); token
        texts are then stored, decoded once per id (lone surrogates stored as U+FFFD). The first
        `record` call decodes its first token: a tokenizer that gives anything but one str per
        id raises TypeError there; one that does not answer within `writer_timeout` raises
        WriterError there and the run is closed `failed`. None leaves the `token` column null.
    config: the training configuration (a dataclass or a mapping), stored in run.json.
    rows_per_file: token rows per part file (and the bound of the writer's buffer).
    flush_seconds: rows older than this are written even when a part file is not full: the most
        a killed (SIGKILL) run loses. SIGTERM and SIGINT lose nothing.
    flush_steps: write each step's rows at its `end_step` (watch and the dashboard see it within
        seconds; one part file per table and step). None: True with `alerts` (and an alert at once).
    queue_size: batches the writer may hold before `record` waits for it.
    rank, world_size: this process's shard of the run. Default: torch.distributed when it is
        initialised, else the RANK / WORLD_SIZE environment, else 0 and 1.
    enabled: False returns a `NullRecorder` (e.g. on tensor-parallel ranks that must not record).
    resume: reopen a run written before (same run_id); steps up to its last recorded step are
        refused. On a directory without a run, starts one.
    overwrite: replace this rank's rows (and, on rank 0, run.json) of a run written before.
    writer_timeout: the most seconds a call waits on the writer (full queue, flush, close) or the
        tokenizer's first decode before raising WriterError.
    keep: a `Keep` (trustlens.run.aggregates): every token that matters (blocked by `active_rule`
        or `Keep.rules`, rare, ...), a seeded weighted share of the rest, and the exact
        `aggregates` of all tokens (docs/run-format.md). None: every token.
    sampling: how the rollout engine sampled and what log μ it reported, for run.json:
        {"temperature": τ, "top_p", "top_k", "min_p", "logprobs": "raw" | "tempered" | "processed",
        "processors": the active logit processors}, each None when not known (or the filter is
        off); checked and completed by `trustlens.run.manifest.normalise_sampling`. None: not
        known. A resumed run keeps the values it was started with.
    model_kind: "dense" (default) or "moe", for run.json (the published mismatch ranges differ).
    mirror: stream each step's scalars live to TensorBoard or W&B: "tensorboard:LOGDIR",
        "wandb", "wandb:PROJECT" or a sink object (trustlens.export.mirror; docs/export.md).
        The scalars are those of this rank's rows. None: no mirror.
    alerts: True (default thresholds) or a `CollapseConfig`: raise the collapse alerts and the
        doctor's findings live, from this rank's rows, on the writer thread (trustlens.live);
        they go to the run's `alerts` table, the mirror, `on_alert` and `live_alerts` (False: none).
    on_alert: a callable given each `LiveAlert` of severity warning or above when it is raised
        or turns more severe, on a thread of its own; an exception in it is warned once.
    planned_steps: the training steps the run plans, for run.json (the live alerts' baseline
        window; None: config's `steps`, else 15 steps).
    """

    # The class `TokenRecorder(..., enabled=False)` returns: NullRecorder, a subclass defined in
    # trustlens.record.null, which registers itself here (importing trustlens.record does).
    disabled_class: ClassVar[type[TokenRecorder] | None] = None
    # True: CPU tensors take the accelerator's path (`stage_rows`), so that tests can run it
    _staged_on_cpu = False

    def __new__(cls, *args: Any, enabled: bool = True, **kwargs: Any) -> TokenRecorder:
        if not enabled and cls is TokenRecorder and cls.disabled_class is not None:
            return super().__new__(cls.disabled_class)
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
        flush_steps: bool | None = None,
        queue_size: int = 8,
        rank: int | None = None,
        world_size: int | None = None,
        enabled: bool = True,
        resume: bool = False,
        overwrite: bool = False,
        writer_timeout: float = 60.0,
        mirror: Any | None = None,
        keep: Keep | None = None,
        sampling: Mapping[str, Any] | None = None,
        model_kind: str = "dense",
        alerts: Any = False,
        on_alert: Any | None = None,
        planned_steps: int | None = None,
    ) -> None:
        opts = recorder_options(
            run_dir,
            rules=rules,
            active_rule=active_rule,
            tokenizer=tokenizer,
            config=config,
            rows_per_file=rows_per_file,
            flush_seconds=flush_seconds,
            flush_steps=flush_steps,
            queue_size=queue_size,
            rank=rank,
            world_size=world_size,
            enabled=enabled,
            resume=resume,
            overwrite=overwrite,
            writer_timeout=writer_timeout,
            keep=keep,
            sampling=sampling,
            model_kind=model_kind,
            alerts=alerts,
            on_alert=on_alert,
            planned_steps=planned_steps,
        )
        self.keep, self.rules = keep, opts.rules
        self._columns = RecordedColumns(self.rules, given=rules is not None)
        names = [r.name for r in self.rules]
        # the copies of record calls, reused once their rows are taken: as many sets as can be in
        # flight (the queue's and the one the writer works on), so none is allocated again
        self._buffers = Buffers(keep=opts.queue_size + 1)
        self._host = Buffers(keep=opts.queue_size + 1, pin=True)  # host copies of an accelerator's rows
        self.rank, self.world_size = opts.rank, opts.world_size
        self._keep_args = (keep, self.rank, active_rule)  # how the writer thread samples the rows (keep_rows)
        taps = live_taps(mirror, alerts, on_alert, opts.live)
        self._live = taps[1]
        if resume:
            check_resumed_rules(run_dir, self.rank, names)
        self._writer = open_writer(run_dir, opts, tokenizer=tokenizer, resume=resume, overwrite=overwrite, taps=taps)
        self.path: Path | Remote = self._writer.path  # a local Path, or an object-store location
        # steps a resumed run may still record: after its last recorded one
        last = self._writer.writer.last_step
        self._first_step = 0 if last is None else last + 1
        self._ids = SampleIds(self.rank)
        self._tokenizer_unchecked = tokenizer is not None  # until a call's first token is decoded
        self._closed = False
        atexit.register(self._at_exit)
        interrupts.watch(id(self), self._interrupted)

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
        support_size: torch.Tensor | None = None,  # (B, T) ids in the engine's sampling support (its mask)
        pi_support_mass: torch.Tensor | None = None,  # (B, T) Σ π over that support, probability mass
        staleness: torch.Tensor | None = None,  # (B, T) weight updates between a_t's engine weights and π's
        seq_weight: torch.Tensor | None = None,  # (B, T) the sequence importance weight the trainer applied
        sample_ids: torch.Tensor | Sequence[int] | None = None,  # (B,) unique sample ids
        group_ids: torch.Tensor | Sequence[int] | None = None,  # (B,) prompt-group ids
        update: int = 0,  # minibatch update within the step
        temperature: float = 1.0,  # rollout sampling temperature: logits are divided by it
        topk_tv: torch.Tensor | None = None,  # (B, T) top-K TV already computed (then not from logits)
        topk_kl: torch.Tensor | None = None,  # (B, T) top-K KL(μ‖π) already computed, nats
        blocked: Mapping[str, torch.Tensor] | None = None,  # rule -> (B, T) bool decisions already made
        mu_routed_experts: torch.Tensor | None = None,  # (B, T, L, k) int: the engine's experts, −1 on dense layers
        pi_routed_experts: torch.Tensor | None = None,  # (B, T, L, k) int: the trainer's, from π's forward
        num_experts: int | None = None,  # experts per MoE layer: ids must be below it (None: < 2¹⁵)
    ) -> int:
        """Record the valid tokens of one batch; returns the number of rows recorded.

        Shapes, types and arguments are checked before anything is queued: a bad one raises
        ValueError (naming the argument and what is wrong) and records nothing. The values
        (NaN, ±inf, log-probabilities > 0, negative divergences, ids outside [0, 2³¹)) are
        checked on the recorder's copy: for accelerator tensors on the device, read back with
        the row count in the call's one host synchronisation, a bad value raising from this call
        (its rows then leave the device in non-blocking copies the writer thread waits for); for
        CPU tensors by the writer thread, off the training step's path, so that a bad value is found
        after the call returned: that call's rows are dropped (its default sample ids stay
        used) and the next `record`, `log_*`, `flush` or `close` raises `RejectedInputError`
        (a ValueError naming the call's step and update, the argument and the (b, t) index), after
        doing its own work. Default sample ids number the samples of (step, update) on this rank
        in call order: step · 10⁹ + rank · 10⁶ + index; default group ids equal the sample ids.
        They join the samples table (`log_samples`, numbered the same way per step) only while
        every update records the step's samples in the order they were logged: a loop that
        shuffles or subsamples minibatches between updates must pass `sample_ids`.

        A mixture-of-experts model's routing: `mu_routed_experts` and `pi_routed_experts` (both
        or neither; ids below `num_experts`) give each row route_flips, route_first_flip,
        route_overlap and its flipped layers' expert sets, and the run's routing table exact
        per-layer counts (trustlens.run.routes; docs/run-format.md).

        Precomputed values (computed once by the trainer, e.g. for its loss) skip the recorder's
        own computation: `topk_tv`/`topk_kl` (both or neither) replace the top-K divergence
        from `logits`; `blocked[rule]` replaces the evaluation of that rule (rules not in it are
        evaluated here). They must be what the recorder would compute (same anchor, thresholds
        and temperature); only their shape, type and finiteness are checked.
        """
        self._check_open()
        step = self._step("step", step)
        update = int_arg("update", update, 0, 2**15)
        inputs = checked_inputs(
            token_ids=token_ids,
            response_mask=response_mask,
            advantages=advantages,
            logits=logits,
            mu_topk_ids=mu_topk_ids,
            mu_topk_logp=mu_topk_logp,
            temperature=temperature,
            per_token={
                "pi_logp": pi_logp,
                "mu_logp": mu_logp,
                "old_logp": old_logp,
                "entropy": entropy,
                "topk_tv": topk_tv,
                "topk_kl": topk_kl,
                "support_size": support_size,
                "pi_support_mass": pi_support_mass,
                "staleness": staleness,
                "seq_weight": seq_weight,
            },
            routed=(mu_routed_experts, pi_routed_experts, num_experts),
        )
        shape = inputs.shape
        decided = self._columns.check_blocked(blocked, shape)
        device = pi_logp.device
        given_mask = check_mask("response_mask", response_mask, token_ids)
        mask = self._buffers.empty(tuple(given_mask.shape), torch.bool, device).copy_(given_mask)
        id_key = ("tokens", step, update)
        # the caller's ids key rows only where their sample has a valid position (one host read, as
        # reading the ids themselves is)
        live = None if sample_ids is None else mask.any(dim=1).cpu().numpy()
        samples = self._ids.of_call("sample_ids", sample_ids, shape[0], device, id_key, live)
        groups = samples if group_ids is None else self._ids.of_call("group_ids", group_ids, shape[0], device, None)
        ids = snapshot_token_ids(token_ids, mask, self._buffers)
        if self._tokenizer_unchecked and bool(mask.any()):  # a bad tokenizer fails here, not in the writer
            self._tokenizer_unchecked = False
            check_tokenizer_answer(self._writer, int(token_ids[mask][0]), self.close)
        # an accelerator's inputs are checked on the device and read back once (`stage_rows`):
        # flags (bool tensors, True: a check failed) and the checks that name the bad value
        staged = device.type != "cpu" or self._staged_on_cpu
        call = snapshot_call(
            inputs,
            mask=mask,
            token_ids=ids,
            samples=samples,
            groups=groups,
            decided=decided,
            buffers=self._buffers,
            staged=staged,
        )
        evaluable, recorded = self._columns.evaluable(call.columns, tuple(decided))
        job, n_rows = self._job(step, update, call, evaluable, staged)
        manifest_update = self._columns.note_anchor("mu" if mu_logp is not None else "old", recorded)
        if manifest_update is not None:
            self._writer.put_manifest(manifest_update)
        # last: the writer thread wakes up to it and would compete for the GIL with any torch op after
        self._writer.put_tokens(job)
        self._ids.note(id_key, samples, shape[0], live)
        self._writer.raise_rejected()  # an earlier call's bad input, found by the writer thread
        return n_rows

    def _job(self, step: int, update: int, call: CallSnapshot, evaluable: list, staged: bool) -> tuple[Any, int]:
        """(the writer thread's job that makes the call's TokenBatch, the call's row count). An
        accelerator's call is checked here in one host synchronisation and copied to the host
        without waiting (`stage_rows`); a CPU call's flags are read at once, and its values
        checked, taken and derived by the writer thread (off the training step's path)."""
        rows, flags, explain = call.rows, call.flags, call.explain
        if staged:
            on_host, n_rows = stage_rows(rows, flags, explain, self._host)
            job = functools.partial(derive_staged, step, update, on_host, self.rules, evaluable, *self._keep_args)
            return job, n_rows
        if flags and bool(torch.stack([f.any() for f in flags]).any()):
            for check in explain:
                check()
        job = functools.partial(derive_rows, step, update, rows, self.rules, evaluable, *self._keep_args)
        return job, int(rows.mask.count_nonzero())

    def __enter__(self) -> TokenRecorder:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(exc)
