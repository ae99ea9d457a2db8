"""Logs written the way the frameworks' loggers write them, for the import tests.

- verl 0.7.0 (verl/utils/tracking.py, commit f9c855f7): `_TensorboardAdapter.log` calls
  `torch.utils.tensorboard.SummaryWriter.add_scalar(key, value, step)` for each key of the step's
  metrics dict, and `FileLogger.log` writes `json.dumps({"step": step, "data": data})` and a
  newline per call. verl is not installed here: both are reproduced as written there.
- TRL (installed, 1.16.0) logs through HF Trainer: `Trainer.log` appends each logs dict, with
  `step`, to `TrainerState.log_history` (saved by `TrainerState.save_to_json` as
  trainer_state.json), and `TensorBoardCallback.on_log` writes `train/<name>` scalars: both are
  called here as the trainer calls them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

COLLAPSE_AT = 70  # the step the synthetic verl run's reward and accuracy fall at
FILLER = [f"timing_s/stage_{i}" for i in range(30)] + [f"perf/counter_{i}" for i in range(10)]


def verl_steps(steps: int = 120, seed: int = 0, filler: bool = True) -> list[tuple[int, dict[str, float]]]:
    """(step, metrics) of a verl GRPO run that learns, then collapses at COLLAPSE_AT: entropy
    and the mismatch move from step 55, the reward and held-out accuracy fall at COLLAPSE_AT.
    verl's steps count from 1 (`global_steps`)."""
    rng = np.random.default_rng(seed)
    out = []
    for step in range(1, steps + 1):
        learn = min(step, 40) / 40
        late = step >= COLLAPSE_AT
        drift = max(0, step - 55) / 15
        m = {
            "critic/score/mean": (0.1 if late else 0.2 + 0.4 * learn) + 0.01 * rng.standard_normal(),
            "critic/rewards/mean": (0.1 if late else 0.2 + 0.4 * learn) + 0.01 * rng.standard_normal(),
            "actor/entropy": 0.8 * (0.35 if drift >= 1 else 1 - 0.65 * drift) + 0.01 * rng.standard_normal(),
            "rollout_corr/k3_kl": 5e-4 * (1 + 30 * min(drift, 1)) * math.exp(0.1 * rng.standard_normal()),
            "rollout_corr/kl": 5e-4 * (1 + 30 * min(drift, 1)) * (1 + 0.2 * rng.standard_normal()),
            "training/rollout_probs_diff_mean": 2e-3 * (1 + 5 * min(drift, 1)),
            "actor/grad_norm": (8.0 if 64 <= step <= 69 else 1.0) * math.exp(0.05 * rng.standard_normal()),
            "actor/pg_clipfrac": (0.002 + 0.03 * min(drift, 1)) * math.exp(0.05 * rng.standard_normal()),
            "response_length/mean": 200 + 5 * rng.standard_normal(),
        }
        if step % 10 == 0:
            m["val-core/openai/gsm8k/acc/mean@1"] = (0.1 if late else 0.3 + 0.2 * learn) + 0.005 * rng.standard_normal()
        if filler:
            m |= {name: float(rng.random()) for name in FILLER}
        out.append((step, {k: float(v) for k, v in m.items()}))
    return out


def write_verl_tensorboard(folder: Path, steps) -> Path:
    """verl's _TensorboardAdapter: add_scalar(key, value, step) per key, torch's SummaryWriter."""
    from torch.utils.tensorboard import SummaryWriter

    folder.mkdir(parents=True, exist_ok=True)
    writer = SummaryWriter(str(folder))
    for step, data in steps:
        for key in data:
            writer.add_scalar(key, data[key], step)
    writer.close()
    return folder


def write_verl_jsonl(path: Path, steps) -> Path:
    """verl's FileLogger: one `{"step": step, "data": data}` JSON line per log call."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fp:
        for step, data in steps:
            fp.write(json.dumps({"step": step, "data": data}) + "\n")
    return path


def trl_logs(steps: int = 30) -> list[dict[str, float]]:
    """What GRPOTrainer.log passes to Trainer.log per logging step: TRL's metric names (the
    averages of its `_metrics`), HF Trainer's loss, grad_norm and learning_rate."""
    rng = np.random.default_rng(1)
    return [
        {
            "loss": float(0.01 * rng.standard_normal()),
            "grad_norm": float(1 + 0.1 * rng.random()),
            "learning_rate": 1e-6,
            "reward": float(0.3 + 0.01 * s),
            "reward_std": 0.2,
            "entropy": float(0.7 - 0.001 * s),
            "clip_ratio/region_mean": 0.004,
            "completions/mean_length": 180.0,
            "sampling/sampling_logp_difference/mean": 0.02,
            "sampling/sampling_logp_difference/max": 1.5,
            "sampling/importance_sampling_ratio/mean": 1.0,
            "kl": 0.001,
        }
        for s in range(steps)
    ]


def write_trl_logs(folder: Path, logs: list[dict[str, float]]) -> tuple[Path, Path]:
    """trainer_state.json and a TensorBoard dir as HF Trainer writes them for TRL's logs
    (TrainerState.log_history, TensorBoardCallback.on_log); (trainer_state.json, the TB dir)."""
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.integrations import TensorBoardCallback

    folder.mkdir(parents=True, exist_ok=True)
    args = TrainingArguments(output_dir=str(folder / "out"), report_to=[])
    state = TrainerState()
    callback = TensorBoardCallback()
    callback.logging_dir = str(folder / "tb")  # as TENSORBOARD_LOGGING_DIR sets it
    control = TrainerControl()
    state.is_world_process_zero = True
    callback.on_train_begin(args, state, control)
    for n, entry in enumerate(logs, 1):
        state.global_step = n
        state.log_history.append({**entry, "step": n})  # Trainer.log
        callback.on_log(args, state, control, logs=dict(entry))
    callback.on_train_end(args, state, control)
    state.save_to_json(str(folder / "trainer_state.json"))
    return folder / "trainer_state.json", folder / "tb"
