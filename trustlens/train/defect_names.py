"""The bugs `trustlens train --engine` plants, by name (their code: trustlens.train.engine_defects).
No torch here: the CLI's help lists them in an install without it."""

from __future__ import annotations

# name -> what the engine does wrong (the `--engine` choices; "clean" is the default)
ENGINE_DEFECTS: dict[str, str] = {
    "clean": "no defect: μ is the distribution the tokens were sampled from",
    "raw_logprobs": "samples at τ, reports log μ from the logits before the division by τ",
    "top_p": "samples with top-p 0.8, reports μ renormalised over the kept tokens",
    "top_p_mask": "as top_p, and returns its sampling masks, which the trainer records but does not apply to π",
    "shifted": "log μ of position t − 1 at position t within each response",
    "sentinel": "log μ written as 0.0 at 10% of the response tokens",
    "token_ids": "the trainer receives <unk> where the engine sampled ';'",
    "batch_variant": "the output layer of a partial engine batch's rows runs as a split-K GEMM",
    "frozen_policy": "adds an adapter's logit delta again at every weight sync (train it with lr 0)",
    "resume": "the run resumes halfway and the engine restarts from the warm start, receiving syncs as deltas",
    "sequence_sum": "the trainer weights each response by exp(Σ log(π_old/μ)), the sum where the mean belongs",
}


def check_defect(defect: str) -> str:
    """`defect` when it names an ENGINE_DEFECTS entry, else ValueError."""
    if defect not in ENGINE_DEFECTS:
        raise ValueError(f"engine must be one of {', '.join(ENGINE_DEFECTS)}, got {defect!r}")
    return defect


def defects_help() -> str:
    """The `--engine` flag's help: every defect's name."""
    names = list(ENGINE_DEFECTS)
    return (
        "plant a log-probability bug of the rollout engine, or of the trainer's sequence weight "
        f"(docs/train.md): {', '.join(names[:-1])} or {names[-1]}"
    )


__all__ = ["ENGINE_DEFECTS", "check_defect", "defects_help"]
