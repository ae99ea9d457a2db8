"""trustlens.integrations.openrlhf at OpenRLHF's `ActorPPOTrainer.ppo_train` / `training_step`
level, on a CPU: OpenRLHF's own replay buffer, gradient-accumulation windows, `Actor` forward and
`PolicyLoss` with a tiny Qwen2, checked against the tensors its loss used; the driver's samples and
metrics go through `BasePPOTrainer`'s hooks.

Not tested: Ray, DeepSpeed (a test-only strategy stand-in does backward and the optimizer step),
vLLM and flash-attn (test-only stand-ins in stand_ins/, imported by OpenRLHF's modules at load
time only). Runs in a venv with OpenRLHF (`.ci/run` makes it); skipped elsewhere.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace as NS

import numpy as np
import polars as pl
import pytest

pytest.importorskip("openrlhf")
pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow
try:
    import vllm  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).with_name("stand_ins")))

import torch  # noqa: E402
from openrlhf.models import Actor, PolicyLoss  # noqa: E402
from openrlhf.trainer.ppo_trainer import BasePPOTrainer  # noqa: E402
from openrlhf.trainer.ppo_utils.experience import Experience  # noqa: E402
from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer  # noqa: E402
from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # verl_cpu, for verl_actor
from verl_actor import V, tiny_qwen2  # noqa: E402  (the same tiny Qwen2; no verl import)

from trustlens import load_run  # noqa: E402
from trustlens.integrations import openrlhf as hook  # noqa: E402
from trustlens.integrations._external import finish  # noqa: E402

B, P, A = 8, 5, 6  # samples, prompt and action widths
STEPS, GAS = 2, 2  # training steps, micro-batches per optimizer step


class Tokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(f"t{i}" for i in ids)


class Strategy:
    """Test-only stand-in for OpenRLHF's DeepspeedStrategy: plain backward and SGD steps."""

    accumulated_gradient = GAS
    ring_attn_group = None

    def __init__(self, args):
        self.args = args
        self.calls = 0

    def is_rank_0(self):
        return True

    def all_reduce(self, x):
        return x

    def backward(self, loss, model, optimizer):
        loss.backward()

    def optimizer_step(self, optimizer, model, scheduler, name=""):
        self.calls += 1
        if self.calls % GAS == 0:
            optimizer.step()
            optimizer.zero_grad()

    def get_grad_norm(self, model):
        return 0.0


def _args():
    return NS(
        train=NS(dynamic_batch_enable=False, max_epochs=1),
        actor=NS(
            entropy_coef=None,
            aux_loss_coef=0.0,
            num_nodes=1,
            num_gpus_per_node=1,
            eps_clip_low_high=(0.2, 0.28),
            dual_clip=None,
            policy_loss_type="ppo",
        ),
        algo=NS(
            kl=NS(use_loss=False),
            advantage=NS(
                is_correction_level="off",
                is_correction_mode="mask",
                is_correction_gating="ratio",
                is_correction_threshold=(0.5, 5.0),
            ),
        ),
        ds=NS(tensor_parallel_size=1),
        logger=NS(logging_steps=1),
        ckpt=NS(save_steps=10**9),
    )


def _tiny_actor():
    actor = Actor(tiny_qwen2())
    actor.packing_samples = False  # Actor sets it only when it loads a model from a path
    return actor


def _experience(actor, step: int) -> Experience:
    """A left-padded prompt / right-padded action batch with π_old from the actor, μ = π_old +
    noise and per-sequence advantages (two of them 0)."""
    g = torch.Generator().manual_seed(step)
    seqs = torch.zeros(B, P + A, dtype=torch.long)
    attn = torch.zeros(B, P + A, dtype=torch.long)
    for i in range(B):
        n_p, n_a = int(torch.randint(2, P + 1, (1,), generator=g)), int(torch.randint(2, A + 1, (1,), generator=g))
        seqs[i, P - n_p : P + n_a] = torch.randint(1, V, (n_p + n_a,), generator=g)
        attn[i, P - n_p : P + n_a] = 1
    action_mask = attn[:, P:].bool()
    with torch.no_grad():
        old = actor(seqs, action_mask, attention_mask=attn) * action_mask
    mu = (old + 0.05 * torch.randn(old.shape, generator=g)).clamp(max=0) * action_mask
    adv = torch.randn(B, generator=g)
    adv[:2] = 0.0
    return Experience(
        sequences=seqs,
        attention_mask=attn,
        action_mask=action_mask,
        action_log_probs=old,
        rollout_log_probs=mu,
        advantages=adv[:, None] * action_mask,
        info={"reward": adv.clone()},
    )


@pytest.fixture(scope="module")
def openrlhf_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("openrlhf") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRUSTLENS_DIR", str(run_dir))
        mp.setattr(torch.cuda, "current_device", lambda: "cpu")  # ppo_train moves batches there
        hook.setup()
        args = _args()
        calls: list[dict] = []
        loss_fn = PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28)
        spied = type(loss_fn).forward

        def spy(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None, **kw):
            m = action_mask.bool()
            calls.append({k: t.detach()[m].numpy() for k, t in (("pi", log_probs), ("old", old_log_probs))})
            return spied(self, log_probs, old_log_probs, advantages, action_mask, rollout_log_probs, **kw)

        mp.setattr(PolicyLoss, "forward", spy)  # outermost: sees what the hook and the loss see
        actor = _tiny_actor()
        trainer = object.__new__(ActorPPOTrainer)
        trainer.__dict__.update(
            strategy=Strategy(args),
            args=args,
            actor=actor,
            actor_optim=torch.optim.SGD(actor.parameters(), lr=0.5),
            actor_scheduler=NS(get_last_lr=lambda: [0.5]),
            actor_loss_fn=loss_fn,
            ema_model=None,
            aux_loss=False,
            max_epochs=1,
            dataloader_pin_memory=False,
        )
        driver = object.__new__(BasePPOTrainer)
        driver.__dict__.update(args=args, tokenizer=Tokenizer(), wandb_logger=None, tensorboard_logger=None)
        for step in range(1, STEPS + 1):
            experience = _experience(actor, step)
            driver.experience_maker = NS(make_experience_batch=lambda samples, e=experience: [e])

            def ppo_train(global_steps, e=experience):
                with pytest.MonkeyPatch.context() as cuda:
                    cuda.setattr(torch.cuda, "current_device", lambda: 0)  # only names a device here
                    trainer.replay_buffer = NaiveReplayBuffer(sample_batch_size=2, cpu_offload=False)
                trainer.replay_buffer.append(e)
                trainer.ppo_train(kl_ctl=0.0)
                return {"policy_loss": 0.5 * global_steps}

            driver.ppo_train = ppo_train
            driver.vllm_engines = None
            driver.critic_model_group = None
            driver.actor_model_group = NS(async_run_method_batch=lambda **kw: [])
            driver._compute_rollout_stats = lambda exps: {}
            driver.kl_ctl = NS(update=lambda *a: None)
            mp.setattr("ray.get", lambda refs: refs)
            status, _ = driver.train_step(None, step)
            driver.save_logs_and_checkpoints(step, {k: v for k, v in status.items() if k != "generated_samples"})
        hook._state["worker"].close()
        finish(hook._state, None)
    return run_dir, calls


def test_rows_are_the_tensors_openrlhf_trained_on(openrlhf_run):
    run_dir, calls = openrlhf_run
    run = load_run(run_dir)
    tokens = run.tokens.collect()
    assert run.manifest["status"] == "finished"
    assert run.manifest["active_rule"] == "minirl"
    assert run.manifest["rules"]["minirl"]["high"] == 0.28
    assert tokens["rank"].unique().to_list() == [1]
    assert len(tokens) == sum(len(c["pi"]) for c in calls) > 0
    assert tokens.select("step", "update", "sample", "pos").is_duplicated().sum() == 0
    assert tokens["mu_logp"].null_count() == 0
    # 4 micro-batches of 2 per step, GAS = 2 per optimizer step: updates 0 and 1
    assert sorted(tokens.select("step", "update").unique().rows()) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    for column, key in (("pi_logp", "pi"), ("old_logp", "old")):
        used = np.sort(np.concatenate([c[key] for c in calls]).astype(np.float32))
        np.testing.assert_allclose(np.sort(tokens[column].to_numpy()), used, rtol=0, atol=1e-6)
    zero = tokens.filter(pl.col("advantage") == 0)
    assert len(zero) > 0 and not zero["blocked_minirl"].any()


def test_samples_and_metrics_join_the_tokens(openrlhf_run):
    run = load_run(openrlhf_run[0])
    tokens, samples, metrics = run.tokens.collect(), run.samples.collect(), run.metrics.collect()
    assert len(samples) == STEPS * B
    joined = tokens.join(samples.select("step", "sample", "length"), on=["step", "sample"], how="left")
    assert joined["length"].null_count() == 0
    per_sample = tokens.group_by("step", "sample").agg(pl.len()).join(samples, on=["step", "sample"])
    assert (per_sample["len"] == per_sample["length"]).all()
    assert metrics.filter(pl.col("name") == "openrlhf/policy_loss")["value"].to_list() == [0.5, 1.0]


@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [({}, "minirl"), ({"dual_clip": 3.0}, "minirl"), ({"policy_loss_type": "gspo"}, None)],
)
def test_openrlhf_losses_map_to_rules(kwargs, rule):
    name, *_, note = hook.openrlhf_active_rule(PolicyLoss(**kwargs))
    assert name == rule and note
    assert ("dual clip" in note) == ("dual_clip" in kwargs)


def test_ray_setup_hook_patches_openrlhf_in_every_ray_process(tmp_path):
    """The runtime_env `python -m trustlens.integrations.openrlhf` starts Ray with: a Ray worker
    process (OpenRLHF's actors are ones) comes up patched."""
    import ray

    stand_ins = str(Path(__file__).with_name("stand_ins"))
    env = {"TRUSTLENS_DIR": str(tmp_path / "run"), "OMP_NUM_THREADS": "1", "PYTHONPATH": stand_ins}
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        runtime_env={"worker_process_setup_hook": "trustlens.integrations.openrlhf.setup", "env_vars": env},
    )
    try:
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}  # tests/integrations/conftest.py

        @ray.remote
        def patched() -> bool:
            from openrlhf.trainer.ppo_trainer import PPOTrainer
            from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

            return hasattr(ActorPPOTrainer.training_step, "__wrapped__") and hasattr(PPOTrainer.fit, "__wrapped__")

        assert ray.get(patched.remote())
    finally:
        ray.shutdown()
