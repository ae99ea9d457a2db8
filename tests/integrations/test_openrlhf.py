"""trustlens.integrations.openrlhf through OpenRLHF's own training loop, on a CPU: `fit` of the
`PPOTrainer` class Ray ships to OpenRLHF's trainer actor (cloudpickled after `setup`, as Ray
exports it, and loaded as Ray's worker loads it), with OpenRLHF's `train_step`, `ppo_train` and
`save_logs_and_checkpoints`, feeding two actors' own `ActorPPOTrainer.ppo_train` /
`training_step` (replay buffer, gradient-accumulation windows, `Actor` forward and `PolicyLoss`
with a tiny Qwen2). The rows are checked against the tensors the loss used, the driver's samples
and metrics against the tokens, on the steps `fit` logs.

Test-only stand-ins: the samples generator and experience maker (seeded batches: OpenRLHF's
rollout needs vLLM), the actor group (runs both actors in this process, each with the hook state
its own Ray process would hold, and splits the experiences as RayActorGroup does), DeepSpeed's
strategy (plain backward and SGD steps), and the `vllm` / `flash_attn` modules OpenRLHF imports
at load time (stand_ins/). Not tested: Ray actors themselves (a Ray worker with the setup hook is:
last test), DeepSpeed, vLLM, ring attention, dynamic batching. Runs in a venv with OpenRLHF
(`.ci/run` makes it); skipped elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import pickle
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
from openrlhf.trainer.ppo_trainer import PPOTrainer  # noqa: E402
from openrlhf.trainer.ppo_utils.experience import Experience  # noqa: E402
from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer  # noqa: E402
from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # verl_cpu, for verl_actor
from verl_actor import V, tiny_qwen2  # noqa: E402  (the same tiny Qwen2; no verl import)

from trustlens import load_run  # noqa: E402
from trustlens.integrations import openrlhf as hook  # noqa: E402
from trustlens.integrations._ray_hooks import WorkerRecording, external_rules  # noqa: E402
from trustlens.integrations.openrlhf.state import STATE  # noqa: E402

B, P, A = 8, 5, 6  # samples per experience (one experience per actor), prompt and action widths
STEPS, GAS, ACTORS = 2, 2, 2  # training steps, micro-batches per optimizer step, data-parallel actors
RESUMED_AT = 5  # the global step of the checkpoint the resumed run starts from


class Tokenizer:
    def decode(self, ids, skip_special_tokens=True):
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
        if ids and isinstance(ids[0], list):
            return [self.decode(row) for row in ids]
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


def _args(ckpt_path: Path, resume: bool):
    return NS(
        train=NS(dynamic_batch_enable=False, max_epochs=1, num_episodes=1),
        actor=NS(
            entropy_coef=None,
            aux_loss_coef=0.0,
            num_nodes=1,
            num_gpus_per_node=ACTORS,
            eps_clip_low_high=(0.2, 0.28),
            dual_clip=None,
            policy_loss_type="ppo",
        ),
        critic=NS(freezing_steps=-1),
        algo=NS(
            kl=NS(use_loss=False),
            dynamic_filtering_enable=False,
            advantage=NS(
                is_correction_level="off",
                is_correction_mode="mask",
                is_correction_gating="ratio",
                is_correction_threshold=(0.5, 5.0),
            ),
        ),
        rollout=NS(batch_size=B, n_samples_per_prompt=1),
        ds=NS(tensor_parallel_size=1, enable_sleep=False),
        vllm=NS(enable_sleep=False),
        eval=NS(steps=10**9),
        logger=NS(logging_steps=1),
        ckpt=NS(save_steps=10**9, load_enable=resume, path=str(ckpt_path)),
    )


def _tiny_actor():
    actor = Actor(tiny_qwen2())
    actor.packing_samples = False  # Actor sets it only when it loads a model from a path
    return actor


def _experiences(actor, step: int) -> list[Experience]:
    """One step's rollout, as ACTORS experiences of B left-padded prompt / right-padded action
    rows: π_old from the actor, μ = π_old + noise, per-sequence advantages (two of them 0). The
    first row of every experience is the same prompt with the same response (the same reward and
    advantage): identical answers that OpenRLHF hands to different actors."""
    g = torch.Generator().manual_seed(step)
    n = ACTORS * B
    seqs = torch.zeros(n, P + A, dtype=torch.long)
    attn = torch.zeros(n, P + A, dtype=torch.long)
    for i in range(n):
        n_p, n_a = int(torch.randint(2, P + 1, (1,), generator=g)), int(torch.randint(2, A + 1, (1,), generator=g))
        seqs[i, P - n_p : P + n_a] = torch.randint(1, V, (n_p + n_a,), generator=g)
        attn[i, P - n_p : P + n_a] = 1
    adv = torch.randn(n, generator=g)
    adv[1:3] = 0.0
    copies = torch.arange(B, n, B)  # the first rows of the other experiences: copies of row 0
    seqs[copies], attn[copies], adv[copies] = seqs[0].clone(), attn[0].clone(), adv[0].clone()
    action_mask = attn[:, P:].bool()
    with torch.no_grad():
        old = actor(seqs, action_mask, attention_mask=attn) * action_mask
    mu = (old + 0.05 * torch.randn(old.shape, generator=g)).clamp(max=0) * action_mask
    mu[copies] = mu[0].clone()
    return [
        Experience(
            sequences=seqs[rows],
            attention_mask=attn[rows],
            action_mask=action_mask[rows],
            action_log_probs=old[rows],
            rollout_log_probs=mu[rows],
            advantages=adv[rows, None] * action_mask[rows],
            response_length=action_mask[rows].sum(1).float(),
            truncated=torch.zeros(B),
            total_length=attn[rows].sum(1).float(),
            info={"reward": adv[rows].clone()},
        )
        for rows in (slice(r * B, (r + 1) * B) for r in range(ACTORS))
    ]


class ActorGroup:
    """Test-only stand-in for OpenRLHF's RayActorGroup of PolicyModelActors: runs each actor's
    `append` and `fit` in this process, each actor with its own trustlens hook state (what its own
    Ray process would hold). The experiences are copied (Ray serialises them) and split as
    `RayActorGroup.async_run_method_batch` splits them: one contiguous chunk per actor."""

    def __init__(self, trainers: list, checkpoint_states: dict | None):
        self.trainers, self.checkpoint_states = trainers, checkpoint_states
        rule = hook.openrlhf_active_rule(trainers[0].actor_loss_fn)
        rules = external_rules(rule)
        self.recordings = [WorkerRecording(r + 1, len(trainers) + 1, rules, rule.name) for r in range(len(trainers))]
        self.rank: int | None = None  # the actor running now (its data-parallel rank)

    def async_run_method_batch(self, method_name, experience):
        assert method_name == "append"
        chunk = -(-len(experience) // len(self.trainers))
        for rank, trainer in enumerate(self.trainers):
            for exp in pickle.loads(pickle.dumps(experience[rank * chunk : (rank + 1) * chunk])):
                trainer.replay_buffer.append(exp)
        return []

    def async_run_method(self, method_name, **kwargs):
        if method_name == "fit":
            return [self._fit(rank, kwargs["kl_ctl"]) for rank in range(len(self.trainers))]
        if method_name == "get_checkpoint_states":
            return [self.checkpoint_states]
        return []  # broadcast_to_vllm: no vLLM here

    def _fit(self, rank: int, kl_ctl: float) -> dict:
        """PolicyModelActor.fit on actor `rank`, in its hook state."""
        self.rank, STATE["worker"] = rank, self.recordings[rank]
        try:
            status = self.trainers[rank].ppo_train(kl_ctl)
            self.trainers[rank].replay_buffer.clear()
            return status
        finally:
            self.rank, STATE["worker"] = None, None

    def close(self) -> None:
        for recording in self.recordings:
            recording.close()


def _actor_trainer(args) -> ActorPPOTrainer:
    actor = _tiny_actor()
    trainer = object.__new__(ActorPPOTrainer)
    trainer.__dict__.update(
        strategy=Strategy(args),
        args=args,
        actor=actor,
        actor_optim=torch.optim.SGD(actor.parameters(), lr=0.5),
        actor_scheduler=NS(get_last_lr=lambda: [0.5]),
        actor_loss_fn=PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28),
        ema_model=None,
        aux_loss=False,
        max_epochs=1,
        dataloader_pin_memory=False,
    )
    with pytest.MonkeyPatch.context() as cuda:
        cuda.setattr(torch.cuda, "current_device", lambda: 0)  # only names a device here
        trainer.replay_buffer = NaiveReplayBuffer(sample_batch_size=2, cpu_offload=False)
    return trainer


class Loader:
    """The prompts dataloader `fit` sizes its progress bar by and saves with checkpoints."""

    def __len__(self) -> int:
        return STEPS

    def state_dict(self) -> dict:
        return {}


def _shipped_trainer_class() -> type:
    """OpenRLHF's PPOTrainer class as Ray ships it to the trainer's actor: the copy Ray made when
    it decorated the class, cloudpickled in this (the launching) process and loaded as Ray's worker
    loads it (unpickled, then given Ray's tracing wrappers). In the process that pickled it,
    cloudpickle hands back the same class object, its methods set anew from the pickle: what a
    method pickles as (by reference, or a copy by value) is what runs."""
    from ray import cloudpickle

    shipped = cloudpickle.loads(cloudpickle.dumps(PPOTrainer.__ray_metadata__.modified_class))
    with contextlib.suppress(ImportError):
        from ray.util.tracing.tracing_helper import _inject_tracing_into_class

        _inject_tracing_into_class(shipped)
    return shipped


def _fit(tmp: Path, resume: bool) -> tuple[Path, list[list[dict]]]:
    """OpenRLHF's `fit` for STEPS steps on ACTORS actors, recorded into a new run; with `resume`,
    from a checkpoint at global step RESUMED_AT (the actors' hook state is new, as after a
    restart). Returns the run directory and each actor's spied PolicyLoss calls."""
    run_dir, ckpt = tmp / "run", tmp / "ckpt"
    (ckpt / "_actor").mkdir(parents=True)
    calls: list[list[dict]] = [[] for _ in range(ACTORS)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRUSTLENS_DIR", str(run_dir))
        mp.setattr(torch.cuda, "current_device", lambda: "cpu")  # ppo_train moves batches there
        mp.setattr("ray.get", lambda refs: refs)  # the actor group runs in this process
        hook.setup()
        args = _args(ckpt, resume)
        states = {"episode": 0, "global_step": RESUMED_AT, "total_consumed_prompts": 0, "data_loader_state_dict": {}}
        group = ActorGroup([_actor_trainer(args) for _ in range(ACTORS)], states if resume else None)
        spied = PolicyLoss.forward

        def spy(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None, **kw):
            m = action_mask.bool()
            used = {k: t.detach()[m].numpy() for k, t in (("pi", log_probs), ("old", old_log_probs))}
            calls[group.rank].append(used)
            return spied(self, log_probs, old_log_probs, advantages, action_mask, rollout_log_probs, **kw)

        mp.setattr(PolicyLoss, "forward", spy)  # outermost: sees what the hook and the loss see
        reference = _tiny_actor()
        made = iter(range(1, STEPS + 1))
        generated = iter(range(1, STEPS + 1))
        driver = object.__new__(_shipped_trainer_class())
        driver.__dict__.update(
            args=args,
            tokenizer=Tokenizer(),
            wandb_logger=None,
            tensorboard_logger=None,
            actor_model_group=group,
            critic_model_group=None,
            vllm_engines=None,
            kl_ctl=NS(value=0.0, update=lambda *a: None),
            experience_maker=NS(make_experience_batch=lambda samples: _experiences(reference, next(made))),
            samples_generator=NS(generate_samples=lambda: (["rollout"], 1.0, 1, next(generated) == STEPS)),
            prompts_dataloader=Loader(),
            eval_dataloader=None,
            generate_kwargs={},
            best_eval_metric_key="",
            best_eval_metric_value=float("-inf"),
            _latest_eval_metric_value=None,
        )
        driver.fit()
        group.close()
    return run_dir, calls


@pytest.fixture(scope="module")
def openrlhf_run(tmp_path_factory):
    return _fit(tmp_path_factory.mktemp("openrlhf"), resume=False)


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    return _fit(tmp_path_factory.mktemp("openrlhf_resumed"), resume=True)[0]


def test_rows_are_the_tensors_openrlhf_trained_on(openrlhf_run):
    run_dir, calls = openrlhf_run
    run = load_run(run_dir)
    tokens = run.tokens.collect()
    assert run.manifest["status"] == "finished"  # by fit's hook, in the class Ray ships
    assert run.manifest["active_rule"] == "minirl"
    assert run.manifest["rules"]["minirl"]["high"] == 0.28
    assert sorted(tokens["rank"].unique().to_list()) == [1, 2]
    assert tokens["mu_logp"].null_count() == 0
    # per actor: 4 micro-batches of 2 per step, GAS = 2 per optimizer step: updates 0 and 1
    assert sorted(tokens.select("step", "update").unique().rows()) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    for rank, rank_calls in enumerate(calls, start=1):
        mine = tokens.filter(pl.col("rank") == rank)
        assert len(mine) == sum(len(c["pi"]) for c in rank_calls) > 0  # one row per token trained
        for column, key in (("pi_logp", "pi"), ("old_logp", "old")):
            used = np.sort(np.concatenate([c[key] for c in rank_calls]).astype(np.float32))
            np.testing.assert_allclose(np.sort(mine[column].to_numpy()), used, rtol=0, atol=1e-6)
    zero = tokens.filter(pl.col("advantage") == 0)
    assert len(zero) > 0 and not zero["blocked_minirl"].any()


def _steps(run_dir: Path) -> tuple[list, list, list]:
    run = load_run(run_dir)
    return tuple(sorted(t.collect()["step"].unique().to_list()) for t in (run.tokens, run.samples, run.metrics))


def _check_joins(run_dir: Path) -> pl.DataFrame:
    """Every token row joins its sample, every sample is trained, each once: its rows equal its
    length, on one rank, and no (step, update, sample, pos) repeats across ranks."""
    run = load_run(run_dir)
    tokens, samples = run.tokens.collect(), run.samples.collect()
    assert len(samples) == STEPS * ACTORS * B and samples.select("step", "sample").is_duplicated().sum() == 0
    assert tokens.select("step", "update", "sample", "pos").is_duplicated().sum() == 0
    joined = tokens.join(samples.select("step", "sample", "length"), on=["step", "sample"], how="left")
    assert joined["length"].null_count() == 0
    per_sample = tokens.group_by("step", "sample").agg(pl.len(), pl.col("rank").n_unique().alias("ranks"))
    per_sample = samples.join(per_sample, on=["step", "sample"], how="left")
    assert (per_sample["len"] == per_sample["length"]).all() and (per_sample["ranks"] == 1).all()
    return per_sample


def test_tokens_samples_and_metrics_are_on_the_steps_fit_logs(openrlhf_run):
    """fit calls train_step(samples, 0) and then save_logs_and_checkpoints(1): all three at 1."""
    run_dir = openrlhf_run[0]
    assert _steps(run_dir) == ([1, 2], [1, 2], [1, 2])
    _check_joins(run_dir)
    metrics = load_run(run_dir).metrics.collect()
    assert metrics.filter(pl.col("name") == "openrlhf/policy_loss")["step"].to_list() == [1, 2]
    assert not metrics["name"].str.contains("trustlens").any()  # the ids and step left info before OpenRLHF logs it


def test_identical_answers_on_two_actors_keep_their_own_sample_ids(openrlhf_run):
    per_sample = _check_joins(openrlhf_run[0])
    for step in range(1, STEPS + 1):
        copies = per_sample.filter(pl.col("step") == step).group_by("prompt", "response").agg(pl.col("sample"))
        copies = copies.filter(pl.col("sample").list.len() > 1)
        assert copies["sample"].list.len().to_list() == [ACTORS]  # one answer, ACTORS samples
        trained = per_sample.filter(pl.col("sample").is_in(copies["sample"].explode().implode()))
        assert trained["ranks"].to_list() == [1] * ACTORS and trained["len"].null_count() == 0


def test_a_resumed_run_goes_on_at_the_checkpoint_s_step(resumed_run):
    """OpenRLHF resumes at the checkpoint's global step; the actors start counting anew."""
    assert _steps(resumed_run) == ([RESUMED_AT + 1, RESUMED_AT + 2],) * 3
    _check_joins(resumed_run)


@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [({}, "minirl"), ({"dual_clip": 3.0}, "minirl"), ({"policy_loss_type": "gspo"}, None)],
)
def test_openrlhf_losses_map_to_rules(kwargs, rule):
    active = hook.openrlhf_active_rule(PolicyLoss(**kwargs))
    assert active.name == rule and active.note
    assert ("dual clip" in active.note) == ("dual_clip" in kwargs)


def test_ray_setup_hook_patches_openrlhf_in_every_ray_process(tmp_path):
    """The runtime_env `python -m trustlens.integrations.openrlhf` starts Ray with: a Ray worker
    process (OpenRLHF's actors are ones) comes up patched, and the PPOTrainer class the launcher's
    process ships to its actor (pickled here after `setup`, as Ray exports it) runs trustlens'
    hooks in that worker."""
    import ray
    from ray import cloudpickle

    import trustlens

    hook.setup()  # what the launcher does before OpenRLHF creates its trainer
    shipped = cloudpickle.dumps(PPOTrainer.__ray_metadata__.modified_class)
    stand_ins = str(Path(__file__).with_name("stand_ins"))
    source = str(Path(trustlens.__file__).resolve().parents[1])  # this trustlens, in the worker too
    env = {
        "TRUSTLENS_DIR": str(tmp_path / "run"),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([stand_ins, source]),
    }
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        runtime_env={"worker_process_setup_hook": "trustlens.integrations.openrlhf.setup", "env_vars": env},
    )
    try:
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}  # tests/integrations/conftest.py

        @ray.remote
        def patched(blob: bytes) -> dict[str, bool]:
            import inspect

            from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer
            from ray import cloudpickle

            from trustlens.integrations.openrlhf import driver as here

            trainer = cloudpickle.loads(blob)  # behind Ray's tracing wrappers, once Ray loaded it
            hooks = {"train_step": here._train_step, "save_logs_and_checkpoints": here._save_logs, "fit": here._fit}
            return {
                "ActorPPOTrainer.training_step": hasattr(ActorPPOTrainer.training_step, "__wrapped__"),
                **{
                    f"PPOTrainer.{name}": inspect.unwrap(getattr(trainer, name)) is hook for name, hook in hooks.items()
                },
            }

        assert ray.get(patched.remote(shipped)) == dict.fromkeys(
            [
                "ActorPPOTrainer.training_step",
                "PPOTrainer.train_step",
                "PPOTrainer.save_logs_and_checkpoints",
                "PPOTrainer.fit",
            ],
            True,
        )
    finally:
        ray.shutdown()
