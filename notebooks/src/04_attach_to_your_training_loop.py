# %% [markdown]
# # 4 · Attach trustlens to your own training loop
#
# `TokenRecorder` is one call per minibatch update in an RL loop you already have: give it the
# sampled token ids, the response mask, log π of the policy being updated, the rollout engine's
# log μ (and π_old if you recompute it) and the advantages. It evaluates every trust-region rule
# on every token, writes Parquet in the background, and the analyses of notebooks 1–3 run on
# what it wrote. Below, a complete toy RL loop in plain PyTorch with the recorder attached, then
# those analyses on its output.

# %% [markdown]
# ## A toy task and policy
#
# The prompt is a digit k; the policy writes six tokens and earns reward 1 when the digit k is
# among them. The policy is deliberately tiny (logits from the prompt and the previous token)
# and starts out preferring filler words, so the rewarded digits begin as rare tokens — the
# regime where PPO's clip and DPPO's bound disagree.

# %%
import tempfile
from pathlib import Path

import polars as pl
import torch
from torch import nn

import trustlens
import trustlens.analysis as A
from trustlens import TokenRecorder, plots, policy_loss
from trustlens.divergence import topk_from_logits
from trustlens.notebook import setup

setup()

WORDS = [" the", " a", " and", " so", " then", " ok", " Wait", " Thus", " answer", " is", " =", "."]
DIGITS = [f" {d}" for d in range(10)]
VOCAB = WORDS + DIGITS  # token id -> text
LENGTH = 6  # response tokens


class Vocab:
    """What TokenRecorder needs of a tokenizer: decode(ids) -> text."""

    def decode(self, ids: list[int]) -> str:
        return "".join(VOCAB[i] for i in ids)


class TinyPolicy(nn.Module):
    """logits(next token) = bias + W_prompt[k] + W_prev[previous token]."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(len(VOCAB)))
        self.prompt = nn.Embedding(10, len(VOCAB))
        self.prev = nn.Embedding(len(VOCAB) + 1, len(VOCAB))  # the last id stands for "start"
        with torch.no_grad():
            self.bias[: len(WORDS)] = 3.0  # filler words first: digits start rare
            self.prompt.weight.normal_(0, 0.5)
            self.prev.weight.normal_(0, 0.5)

    def forward(self, prompts: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        # prompts (B,), prev (B, T) -> logits (B, T, V)
        return self.bias + self.prompt(prompts)[:, None, :] + self.prev(prev)


def previous_tokens(responses: torch.Tensor) -> torch.Tensor:
    start = torch.full_like(responses[:, :1], len(VOCAB))
    return torch.cat([start, responses[:, :-1]], dim=1)


def reward(prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
    return (responses == (prompts[:, None] + len(WORDS))).any(dim=1).float()

# %% [markdown]
# ## The loop
#
# A textbook GRPO loop with a separate rollout engine: a bfloat16 copy of the policy samples
# (as an inference server would, so μ really differs from the trainer's π_old), the trainer
# recomputes π_old, and two epochs over two minibatches (four updates per step, as in PPO) train
# with DPPO's binary-TV mask through `trustlens.policy_loss`. The lines marked `# trustlens` are all the recorder needs.

# %%
STEPS, PROMPTS, GROUP, EPOCHS, MINIBATCHES, LR, TEMPERATURE = 30, 8, 16, 2, 2, 0.1, 1.0
torch.manual_seed(0)
policy = TinyPolicy()
optimizer = torch.optim.Adam(policy.parameters(), lr=LR)
run_dir = Path(tempfile.mkdtemp(prefix="trustlens-loop-")) / "toy_dppo"

# the rules whose decisions are recorded per token (default: every rule of trustlens.RULES)
RECORDED = ["ppo", "ppo_clip_higher", "minirl", "dppo_binary_tv", "dppo_binary_kl", "dppo_topk_tv", "dppo_topk_kl"]

with TokenRecorder(run_dir, rules=RECORDED, active_rule="dppo_binary_tv", tokenizer=Vocab(),  # trustlens
                   config={"steps": STEPS, "group": GROUP, "lr": LR}) as recorder:
    for step in range(STEPS):
        # rollout: the inference engine's own copy of the weights, in bf16
        engine = TinyPolicy().to(torch.bfloat16)
        engine.load_state_dict(policy.state_dict())
        prompts = torch.randint(0, 10, (PROMPTS,)).repeat_interleave(GROUP)  # (B,)
        responses = torch.zeros(len(prompts), LENGTH, dtype=torch.long)
        mu_logits = []
        with torch.no_grad():
            for t in range(LENGTH):
                logits = engine(prompts, previous_tokens(responses)[:, t : t + 1])[:, 0].float() / TEMPERATURE
                responses[:, t] = torch.distributions.Categorical(logits=logits).sample()
                mu_logits.append(logits)
        mu_logits = torch.stack(mu_logits, dim=1)  # (B, T, V)
        mu_logp = torch.log_softmax(mu_logits, -1).gather(-1, responses[..., None])[..., 0]
        mu_topk_ids, mu_topk_logp = topk_from_logits(mu_logits, responses, k=5)

        # rewards and GRPO advantages
        rewards = reward(prompts, responses)
        grouped = rewards.view(PROMPTS, GROUP)
        advantages = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).view(-1)
        mask = torch.ones_like(responses, dtype=torch.bool)
        sample_ids = torch.arange(len(prompts)) + step * len(prompts)
        group_ids = sample_ids // GROUP

        # the trainer recomputes π_old, then updates: EPOCHS passes over MINIBATCHES minibatches
        with torch.no_grad():
            old_logits = policy(prompts, previous_tokens(responses)) / TEMPERATURE
            old_logp = torch.log_softmax(old_logits, -1).gather(-1, responses[..., None])[..., 0]
        minibatches = [rows for _ in range(EPOCHS) for rows in torch.randperm(len(prompts)).chunk(MINIBATCHES)]
        for update, rows in enumerate(minibatches):
            logits = policy(prompts[rows], previous_tokens(responses[rows])) / TEMPERATURE
            pi_logp = torch.log_softmax(logits, -1).gather(-1, responses[rows, :, None])[..., 0]
            out = policy_loss("dppo_binary_tv", pi_logp=pi_logp, mu_logp=mu_logp[rows],
                              old_logp=old_logp[rows], advantages=advantages[rows], response_mask=mask[rows])
            optimizer.zero_grad()
            out.loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            optimizer.step()
            recorder.record(step, update=update, token_ids=responses[rows], response_mask=mask[rows],  # trustlens
                            pi_logp=pi_logp.detach(), mu_logp=mu_logp[rows], old_logp=old_logp[rows],
                            advantages=advantages[rows], logits=logits.detach(), mu_topk_ids=mu_topk_ids[rows],
                            mu_topk_logp=mu_topk_logp[rows], sample_ids=sample_ids[rows], group_ids=group_ids[rows])
        recorder.log_metrics(step, {"reward/mean": rewards.mean(), "grad_norm": grad_norm})  # trustlens
        recorder.log_samples(step, prompts=[f"write the digit {k}" for k in prompts.tolist()],  # trustlens
                             responses=[Vocab().decode(r) for r in responses.tolist()], rewards=rewards,
                             advantages=advantages, sample_ids=sample_ids, group_ids=group_ids)
        if step % 10 == 0 or step == STEPS - 1:
            print(f"step {step:2d}: reward {rewards.mean():.2f}, blocked by the DPPO mask {out.blocked_frac:.1%}")

print(f"recorded into {run_dir}")

# %% [markdown]
# ## The same analyses on what it recorded
#
# `trustlens.load_run` reads the run directory; from here on everything is the library's, as in
# notebooks 1–3. The reward should climb while the policy learns to write rare digits.

# %%
run = trustlens.load_run(run_dir)
A.step_summary(run.tokens).select("step", "tokens", "entropy", "ratio_max", "binary_tv_max",
                                  "blocked_ppo", "blocked_dppo_binary_tv").tail(8)

# %%
signals = A.step_signals(run)
plots.collapse_timeline(signals, A.detect_collapse(run, signals=signals),
                        panels=("reward", "entropy", "k3_kl"), title="The toy run").show()

# %% [markdown]
# Which tokens PPO would have clipped had the loop used it, and where they sit in μ: PPO's clip
# falls on the tokens whose probability moved most *relative to itself* — the rewarded digits
# while they were rare and the filler words being pushed down — while the TV mask blocks only
# the few large moves in probability.

# %%
plots.blocked_by_bucket_bar(A.blocked_by_bucket(run.tokens, ["ppo", "dppo_binary_tv", "dppo_topk_tv"])).show()
A.blocked_by_token(run.tokens, ["ppo", "dppo_binary_tv"], top=6)

# %% [markdown]
# The mismatch the bfloat16 rollout engine introduced, per step: small but not zero, exactly
# what a real inference engine adds.

# %%
A.mismatch_per_step(run.tokens).select("step", "k3_kl", "prob_diff_mean", "prob_diff_max").tail(5)

# %% [markdown]
# ## With TRL
#
# For TRL's `GRPOTrainer`, `trustlens.integrations.trl.TrustLensGRPOTrainer` records every
# micro-batch of TRL's own loss without changing the training (its module docstring says what is
# recorded and where μ comes from). Below, a few GRPO steps of a tiny Llama built locally (the
# tokenizer and model of `trustlens train`, random weights) on a toy reward: longer completions
# earn more. Without vLLM, TRL has no rollout log-probabilities, so μ is not recorded and every
# rule is anchored on π_old — the manifest says so — and TRL's own clip is the `minirl` rule.

# %%
import warnings

from tqdm import TqdmWarning

warnings.filterwarnings("ignore", category=TqdmWarning)  # no progress widgets in a saved notebook
warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' deprecation notices

import datasets
from transformers import PrinterCallback
from trl import GRPOConfig

from trustlens.integrations.trl import TrustLensGRPOTrainer
from trustlens.train.model import ModelConfig, build_model, build_tokenizer

tokenizer = build_tokenizer(max_number=20)
model = build_model(ModelConfig(vocab_size=len(tokenizer), hidden_size=32, num_layers=2, num_heads=2,
                                intermediate_size=64), seed=0)


def length_reward(completions, **kwargs):
    return [len(c.split()) / 8 for c in completions]


trl_dir = run_dir.parent / "trl"
trainer = TrustLensGRPOTrainer(
    model=model, processing_class=tokenizer, reward_funcs=length_reward,
    train_dataset=datasets.Dataset.from_dict({"prompt": ["1 + 2 =", "3 + 4 =", "5 + 6 =", "7 + 8 ="]}),
    args=GRPOConfig(output_dir=str(trl_dir / "checkpoints"), per_device_train_batch_size=8, num_generations=4,
                    steps_per_generation=2, max_completion_length=8, max_steps=8, learning_rate=5e-2,
                    temperature=0.8, use_cpu=True, bf16=False, report_to=[], logging_steps=1,
                    save_strategy="no", seed=0, disable_tqdm=True),
    trustlens_dir=trl_dir / "run",  # trustlens
)
trainer.remove_callback(PrinterCallback)  # keep TRL's per-step log dicts out of the notebook
trainer.train()

trl_run = trustlens.load_run(trl_dir / "run")
print(f"anchor: {trl_run.manifest['anchor']}, not recorded: {', '.join(trl_run.manifest['missing'])}, "
      f"TRL's loss as a rule: {trl_run.active_rule}")
A.step_summary(trl_run.tokens).select("step", "tokens", "samples", "entropy", "ratio_max", "blocked_minirl",
                                      "blocked_dppo_binary_tv")

# %% [markdown]
# The same queries as for any other run: which completion tokens TRL's clip blocked, and which
# the binary-TV mask would have blocked instead.

# %%
A.blocked_by_token(trl_run.tokens, ["minirl", "dppo_binary_tv"], top=5)
