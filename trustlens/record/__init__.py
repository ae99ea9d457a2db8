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

Where the work happens (trustlens.record.token_rows): the caller's thread checks the arguments (shapes,
types; a bad one raises from `record` and records nothing) while copying the per-token inputs and
token ids into one snapshot, and derives what needs π's logits (entropy, top-K:
trustlens.record.logit_quantities), on the tensors' device. Checking the values, taking the valid
positions and deriving the rest (rule decisions on the device; ratio and binary divergences from
the float32 log-probs with numpy, as the reader derives them) happen by the caller for
accelerator tensors, so that only compact rows leave the device, and by the writer thread for
CPU tensors, so that on a CPU the training step pays only for the copy (a bad value then raises
`RejectedInputError` from the next call: `record`).

The anchor of ratio and divergences is μ. When μ is not given (an external trainer without the
rollout engine's log-probs), they are anchored on π_old, `mu_logp` is null and the manifest
says `"anchor": "old"`. With the default rule set, rules whose inputs are missing (π_old for
`minirl`, top-K for `dppo_topk_*`) get a null `blocked_<rule>` column; the manifest lists what
is missing. Rules asked for by name must be decidable at every call.

When the rollout engine samples at temperature τ, pass `temperature=τ` with π's logits (they are
divided by it) so that π and μ describe the same distribution (docs/rules.md); `pi_logp` and
`old_logp` must come from logits divided by τ too.

This module is where the recorder's public names are imported from: `TokenRecorder` (its code:
trustlens.record.recorder), `NullRecorder` (trustlens.record.null), and SAMPLE_STEP and
SAMPLE_RANK, the numbering of default sample ids: step · SAMPLE_STEP + rank · SAMPLE_RANK + index
(trustlens.record.sample_ids).
"""

from trustlens.record.null import NullRecorder
from trustlens.record.recorder import TokenRecorder
from trustlens.record.sample_ids import SAMPLE_RANK, SAMPLE_STEP

__all__ = ["SAMPLE_RANK", "SAMPLE_STEP", "NullRecorder", "TokenRecorder"]
