"""Rebuild tests/data/framework_sources.json: for each entry of trustlens.metrics.FRAMEWORK_NAMES,
the lines of the framework's source (at the release in FRAMEWORKS) that log the name.

    python tests/data/refresh_framework_sources.py MIRRORS

MIRRORS holds a git clone per framework (MIRRORS/<owner>+<name>/repo, as REPOS names them); TRL is
read from the installed package. tests/metrics/test_framework_names.py checks the table against
the JSON without a network.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# framework -> (GitHub repository, the ref of FRAMEWORKS' release)
REPOS = {
    "verl": ("volcengine/verl", "v0.7.0"),
    "trl": ("huggingface/trl", None),  # the installed trl package (its version: FRAMEWORKS["trl"])
    "prime-rl": ("PrimeIntellect-ai/prime-rl", "559b44772e471d1538537b8805cc77f3824a5e64"),
    "nemo-rl": ("NVIDIA-NeMo/RL", "7ea279abfbeb698b092856d0dab61e7cf39bc909"),
    "openrlhf": ("OpenRLHF/OpenRLHF", "v0.11.0"),
    "slime": ("THUDM/slime", "v0.3.1"),
}

_RC = "verl/trainer/ppo/rollout_corr_helper.py"
_DBG = "verl/utils/debug/metrics.py"
_GRPO = "trl/trainer/grpo_trainer.py"
_PRL = "src/prime_rl/trainer/rl/train.py"
_NEMO = "nemo_rl/algorithms/grpo.py"
_NEMO_LOSS = "nemo_rl/algorithms/loss/loss_functions.py"
_ORL = "openrlhf/trainer/ray/ppo_actor.py"
_ORL_LOG = "openrlhf/utils/logging_utils.py"
_SLIME = "slime/backends/megatron_utils/loss.py"
_SLIME_LOG = "slime/backends/megatron_utils/model.py"
_SLIME_EVAL = "slime/ray/rollout.py"
_PRL_MET = "src/prime_rl/orchestrator/metrics.py"
_PRL_EVAL = "src/prime_rl/evals/evals.py"
_ORL_PPO = "openrlhf/trainer/ppo_trainer.py"
_PREFIX = 'metrics_scalar[f"rollout_corr/{key}"]'

# (framework, logged name) -> [(file, the string that logs it)]
SOURCES: dict[tuple[str, str], list[tuple[str, str]]] = {
    ("verl", "rollout_corr/kl"): [(_RC, 'metrics["kl"] = '), (_RC, _PREFIX)],
    ("verl", "rollout_corr/k3_kl"): [(_RC, 'metrics["k3_kl"] = '), (_RC, _PREFIX)],
    ("verl", "rollout_corr/log_ppl_diff"): [(_RC, 'metrics["log_ppl_diff"] = '), (_RC, _PREFIX)],
    ("verl", "rollout_corr/log_ppl_abs_diff"): [(_RC, 'metrics["log_ppl_abs_diff"] = '), (_RC, _PREFIX)],
    ("verl", "rollout_corr/chi2_token"): [(_RC, 'metrics["chi2_token"] = '), (_RC, _PREFIX)],
    ("verl", "rollout_corr/chi2_seq"): [(_RC, 'metrics["chi2_seq"] = '), (_RC, _PREFIX)],
    ("verl", "training/rollout_probs_diff_mean"): [(_DBG, '"training/rollout_probs_diff_mean": torch.mean(')],
    ("verl", "training/rollout_probs_diff_max"): [(_DBG, '"training/rollout_probs_diff_max": torch.max(')],
    ("verl", "training/rollout_actor_probs_pearson_corr"): [
        (_DBG, '"training/rollout_actor_probs_pearson_corr": pearson_corrcoef')
    ],
    ("verl", "actor/entropy"): [("verl/workers/actor/dp_actor.py", 'micro_batch_metrics["actor/entropy"]')],
    ("verl", "actor/pg_clipfrac"): [("verl/trainer/ppo/core_algos.py", '"actor/pg_clipfrac": pg_clipfrac')],
    ("verl", "actor/grad_norm"): [("verl/workers/actor/dp_actor.py", '{"actor/grad_norm": grad_norm')],
    ("verl", "critic/score/mean"): [("verl/trainer/ppo/metric_utils.py", '"critic/score/mean": score_mean')],
    ("verl", "response_length/mean"): [("verl/trainer/ppo/metric_utils.py", '"response_length/mean": torch.mean(')],
    ("verl", "val-core/*/acc/mean@1"): [
        ("verl/trainer/ppo/ray_trainer.py", 'core_var = "acc" if "acc" in var2metric2val else "reward"'),
        ("verl/trainer/ppo/ray_trainer.py", 'metric_sec = "val-core"'),
        ("verl/trainer/ppo/ray_trainer.py", 'pfx = f"{metric_sec}/{data_source}/{var_name}/{metric_name}"'),
    ],
    ("trl", "reward"): [(_GRPO, 'self._metrics[mode]["reward"].append(')],
    ("trl", "reward_std"): [(_GRPO, 'self._metrics[mode]["reward_std"].append(')],
    ("trl", "entropy"): [(_GRPO, 'self._metrics[mode]["entropy"].append(')],
    ("trl", "grad_norm"): [("transformers/trainer.py", 'logs["grad_norm"]')],
    ("trl", "clip_ratio/region_mean"): [(_GRPO, 'self._metrics[mode]["clip_ratio/region_mean"].append(')],
    ("trl", "completions/mean_length"): [(_GRPO, 'self._metrics[mode]["completions/mean_length"].append(')],
    ("trl", "sampling/sampling_logp_difference/mean"): [
        (_GRPO, 'self._metrics[mode]["sampling/sampling_logp_difference/mean"].append(')
    ],
    ("trl", "sampling/sampling_logp_difference/max"): [
        (_GRPO, 'self._metrics[mode]["sampling/sampling_logp_difference/max"].append(')
    ],
    ("trl", "sampling/importance_sampling_ratio/mean"): [
        (_GRPO, 'self._metrics[mode]["sampling/importance_sampling_ratio/mean"].append(')
    ],
    ("trl", "sampling/importance_sampling_ratio/min"): [
        (_GRPO, 'self._metrics[mode]["sampling/importance_sampling_ratio/min"].append(')
    ],
    ("trl", "sampling/importance_sampling_ratio/max"): [
        (_GRPO, 'self._metrics[mode]["sampling/importance_sampling_ratio/max"].append(')
    ],
    ("prime-rl", "mismatch_kl/all/mean"): [
        (_PRL, 'tensors["mismatch_kl/all"].append(mismatch_kl)'),
        ("src/prime_rl/trainer/rl/loss.py", "mismatch_kl = importance_ratio - log_importance_ratio - 1"),
    ],
    ("prime-rl", "entropy/all/mean"): [(_PRL, 'tensors["entropy/all"].append(entropy)')],
    ("prime-rl", "optim/grad_norm"): [(_PRL, 'optim_metrics["optim/grad_norm"] = grad_norm.item()')],
    ("prime-rl", "eval/*/effective/*/avg@*"): [
        (_PRL_MET, 'out[f"{metric_prefix}/avg@{self.group_size}"] = traces.stats()["reward"].mean()'),
        (_PRL_MET, "predicate=lambda record: not record.trace.has_error and record.trace.agent.trainable,"),
        (_PRL_EVAL, 'for subset, pool in (("all", episodes), ("effective", effective)):'),
        (_PRL_EVAL, 'metrics |= pool.metrics.to_wandb(prefix=f"eval/{batch.env_name}", subset=subset)'),
        ("src/prime_rl/monitors/wandb/monitor.py", 'wandb.log({**metrics, "step": step})'),
    ],
    ("nemo-rl", "train/gen_kl_error"): [
        (_NEMO_LOSS, '"gen_kl_error": gen_kl_error,'),
        (_NEMO, 'prefix="train"'),
        (_NEMO, "metrics[k] = np.sum(v).item()"),
    ],
    ("nemo-rl", "train/reward"): [(_NEMO, '"reward": rewards.numpy(),'), (_NEMO, 'prefix="train"')],
    ("nemo-rl", "train/grad_norm"): [
        (_NEMO, '"grad_norm": train_results["grad_norm"].numpy(),'),
        (_NEMO, "metrics[k] = np.sum(v).item()"),
    ],
    ("nemo-rl", "validation/accuracy"): [(_NEMO, '"accuracy": accuracy,'), (_NEMO, 'prefix="validation"')],
    ("openrlhf", "train/vllm_kl"): [
        ("openrlhf/models/loss.py", "vllm_kl = masked_mean(rollout_log_probs - old_log_probs"),
        (_ORL, 'experience.info["vllm_kl"] = vllm_kl.detach()'),
        (_ORL_LOG, 'self.writer.add_scalar(f"train/{k}", v, global_step)'),
    ],
    ("openrlhf", "train/ppo_clip_ratio"): [(_ORL, 'experience.info["ppo_clip_ratio"] = clip_ratio.detach()')],
    ("openrlhf", "train/actor_grad_norm"): [
        (_ORL, 'metrics["actor_grad_norm"] = self.strategy.get_grad_norm(self.actor)'),
        (_ORL, 'if k in ("actor_grad_norm", "actor_lr"):'),
    ],
    ("openrlhf", "train/reward"): [(_ORL, '"reward": merged_status.get("reward", 0),')],
    ("openrlhf", "train/entropy_loss"): [(_ORL, 'metrics["entropy_loss"] = entropy_loss.detach()')],
    ("openrlhf", "eval/eval_*_pass1"): [
        (_ORL_PPO, 'metrics[ds]["pass1"] += chunk.mean().float().item()'),
        (_ORL_PPO, 'logs[f"eval_{ds}_pass1"] = m["pass1"] / m["count"]'),
        (_ORL_PPO, 'eval_generate_kwargs["temperature"] = self.args.eval.temperature'),
        ("openrlhf/cli/train_ppo_ray.py", '"--eval.temperature", type=float, default=0.6'),
        ("openrlhf/cli/train_ppo_ray.py", '"--eval.n_samples_per_prompt", type=int, default=4'),
        (_ORL_LOG, 'self.writer.add_scalar(f"eval/{k}", v, global_step)'),
    ],
    ("slime", "train/train_rollout_logprob_abs_diff"): [
        (_SLIME, 'reported_loss["train_rollout_logprob_abs_diff"] = '),
        (_SLIME_LOG, 'f"train/{role_tag}{key}": val.mean().item()'),
    ],
    ("slime", "train/entropy_loss"): [(_SLIME, '"entropy_loss": entropy_loss.clone().detach(),')],
    ("slime", "train/pg_clipfrac"): [(_SLIME, '"pg_clipfrac": pg_clipfrac.clone().detach(),')],
    ("slime", "train/grad_norm"): [(_SLIME_LOG, 'log_dict[f"train/{role_tag}grad_norm"] = grad_norm')],
    ("slime", "eval/*"): [
        (_SLIME_EVAL, 'log_dict[f"eval/{key}"] = sum(rewards) / len(rewards)'),
        ("slime/rollout/sglang_rollout.py", "dataset_cfg.name: {"),
        ("slime/rollout/sglang_rollout.py", '"rewards": [sample.reward if not reward_key else'),
        ("slime/utils/eval_config.py", '"arg_attrs": ("eval_temperature", "rollout_temperature"),'),
        (_SLIME_EVAL, 'log_dict["eval/step"] = step'),
        ("slime/utils/tensorboard_utils.py", "self._writer.add_scalar(key, data[key], step)"),
        (_SLIME_EVAL, 'compute_metrics_from_samples(args, samples), f"eval/{key}/")'),
        (_SLIME_EVAL, 'log_dict[f"eval/{key}-truncated_ratio"]'),
        (_SLIME_EVAL, 'f"eval/{key}-",'),
        ("slime/utils/metric_utils.py", 'log_dict[f"pass@{k}"] = pass_k'),
    ],
}

# the logger lines that put `train/` before OpenRLHF's and slime's names
LOGGERS = {
    "openrlhf": (_ORL_LOG, 'self.writer.add_scalar(f"train/{k}", v, global_step)'),
    "slime": (_SLIME_LOG, 'f"train/{role_tag}{key}": val.mean().item()'),
}
for (_framework, _logged), _places in SOURCES.items():
    if _framework in LOGGERS and _logged.startswith("train/") and LOGGERS[_framework] not in _places:
        _places.append(LOGGERS[_framework])


def _text(framework: str, file: str, mirrors: Path) -> tuple[str, str]:
    """(the file's text, the commit it was read at)."""
    repo, ref = REPOS[framework]
    if ref is None:  # an installed package: trl, and transformers for HF Trainer's grad_norm
        import importlib

        package = importlib.import_module(file.split("/")[0])
        root = Path(package.__file__).parent.parent
        return (root / file).read_text(), f"{package.__name__} {package.__version__} (installed)"
    git = mirrors / repo.replace("/", "+") / "repo"
    commit = subprocess.run(["git", "-C", git, "rev-parse", f"{ref}^{{commit}}"], capture_output=True, text=True)
    text = subprocess.run(["git", "-C", git, "show", f"{ref}:{file}"], capture_output=True, text=True, check=True)
    return text.stdout, commit.stdout.strip()


def build(mirrors: Path) -> list[dict]:
    out = []
    for (framework, logged), places in SOURCES.items():
        for file, string in places:
            text, commit = _text(framework, file, mirrors)
            lines = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if string in line]
            if not lines:
                raise SystemExit(f"{framework} {logged}: {string!r} not in {file} at {commit}")
            n, line = lines[0]
            repo = REPOS[framework][0]
            out.append(
                {"framework": framework, "logged": logged, "repo": repo, "commit": commit, "file": file}
                | {"line": n, "string": string, "text": line}
            )
    return out


if __name__ == "__main__":
    rows = build(Path(sys.argv[1]))
    path = Path(__file__).with_name("framework_sources.json")
    path.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(rows)} excerpts written to {path}")
