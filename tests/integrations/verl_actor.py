"""verl's own actor code on 2 gloo ranks (CPU) with trustlens.integrations.verl attached: the
actor-level layer of tests/integrations/test_verl.py (examples/verl_grpo.py runs verl's whole
trainer instead). Each rank runs, for two GRPO-style steps, what `main_ppo`'s actor workers run
once the rollout is done (verl imports the hook as `external_lib`):

- verl 0.9 (engine workers): `TrainingWorker.train_mini_batch` → `train_batch` → the FSDP
  engine's `forward_backward_batch` / `forward_step` / `prepare_model_inputs` /
  `prepare_model_outputs` → `losses.ppo_loss`. The engine is verl's `FSDPEngineWithLMHead`
  without its constructor (no FSDP sharding: the model is a plain module, and `optimizer_step`
  averages the gradients over gloo), on the CPU platform of examples/verl_cpu.
- verl 0.7 (legacy FSDP workers): `DataParallelPPOActor.update_policy` on a `DataProto`.

The batches stand in for a rollout: random prompts and responses of a tiny Qwen2 built from a
config, π_old from the model, μ = π_old + noise, per-sequence advantages; one answer repeats,
identical, on both ranks and twice on rank 0. `drive` plays verl's driver before the update:
through the hook of `_update_actor` it records each step's samples and puts the step and each
row's sample id in the batch, which it then splits over the ranks as verl's dispatch does
(`DataProto.chunk`), saved for the rank processes to load; and it logs verl-style metrics.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from verl_cpu.data import TINY

B, P, R, V = 8, 5, 6, 97  # samples per rank, prompt and response widths, vocabulary
LAYERS, TOP_K = 2, 2  # the rollout's routed experts: MoE layers, experts per token
STEPS, MINI, MICRO = 2, 4, 2  # training steps; mini- and micro-batch sizes per rank


def tiny_qwen2():
    """A 2-layer Qwen2 built from a config (no hub), float32, seeded: the same on every rank."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=V, attn_implementation="sdpa", **TINY)
    return Qwen2ForCausalLM(cfg).float()


def routed_experts(prompt_len: torch.Tensor, resp_len: torch.Tensor) -> torch.Tensor:
    """(n, P + R, LAYERS, TOP_K) int16: the rollout's routed experts as verl's agent loop puts
    them in the batch (verl/experimental/agent_loop/agent_loop.py:783-809): zero, the engine's
    rows of positions 0 … p + r − 2 from column P − p. Position q's experts are q·10 + slot on
    every layer where the response token it predicts (t = q − p + 1) is odd, −1 (dense) elsewhere:
    a token's route_overlap is 1 at odd t and null at even t only if the hook reads row p − 1 + t."""
    out = torch.zeros(len(prompt_len), P + R, LAYERS, TOP_K, dtype=torch.int16)
    for i, (p, r) in enumerate(zip(prompt_len.tolist(), resp_len.tolist(), strict=True)):
        q = torch.arange(p + r - 1)
        rows = torch.full((p + r - 1, LAYERS, TOP_K), -1, dtype=torch.int16)
        odd = (q - p + 1) % 2 == 1
        rows[odd] = (q[odd, None, None] * 10 + torch.arange(TOP_K)).to(torch.int16).expand(-1, LAYERS, -1)
        out[i, P - p : P - p + len(rows)] = rows
    return out


def make_batch(model, step: int, world: int):
    """The driver's batch of a step, `world` × B rows of left-padded prompts / right-padded
    responses (B, P + R) with π_old from the model, μ = π_old + noise, per-sequence advantages
    (the last two of each rank's share 0) and the rollout's routed experts (`routed_experts`).
    Row 0's answer repeats, identical, at row 2 (the same rank) and at row B (the next rank): GRPO
    samples that happen to agree."""
    from verl import DataProto

    n = world * B
    g = torch.Generator().manual_seed(1000 * step)
    prompt_len = torch.randint(2, P + 1, (n,), generator=g)
    resp_len = torch.randint(2, R + 1, (n,), generator=g)
    input_ids = torch.zeros(n, P + R, dtype=torch.long)
    attention = torch.zeros(n, P + R, dtype=torch.long)
    for i in range(n):
        input_ids[i, P - prompt_len[i] : P] = torch.randint(1, V, (int(prompt_len[i]),), generator=g)
        input_ids[i, P : P + resp_len[i]] = torch.randint(1, V, (int(resp_len[i]),), generator=g)
        attention[i, P - prompt_len[i] : P + resp_len[i]] = 1
    adv = torch.randn(n, generator=g)
    adv.view(world, B)[:, -2:] = 0.0
    copies = torch.tensor([2, B])
    input_ids[copies], attention[copies], adv[copies] = input_ids[0].clone(), attention[0].clone(), adv[0].clone()
    position_ids = (attention.cumsum(1) - 1).clamp(min=0)
    responses = input_ids[:, P:]
    response_mask = attention[:, P:].clone()
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids).logits
        logp = torch.log_softmax(logits[:, P - 1 : -1].float(), -1).gather(-1, responses[..., None])[..., 0]
    old = logp * response_mask
    mu = (old + 0.05 * torch.randn(old.shape, generator=g)).clamp(max=0) * response_mask
    mu[copies] = mu[0].clone()
    return DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": attention,
            "position_ids": position_ids,
            "prompts": input_ids[:, :P],
            "responses": responses,
            "response_mask": response_mask,
            "old_log_probs": old,
            "rollout_log_probs": mu,
            "advantages": adv[:, None] * response_mask,
            "routed_experts": routed_experts(attention[:, :P].sum(1), attention[:, P:].sum(1)),
        },
        meta_info={"temperature": 1.0},
    )


def batch_path(batches: str, step: int, rank: int) -> Path:
    """Where `drive` leaves rank `rank`'s share of the batch of `step`."""
    return Path(batches) / f"step{step}_rank{rank}.pkl"


def actor_config(strategy: str, router_replay: str = "disabled"):
    """verl's FSDP actor config, its engine's `router_replay.mode` = `router_replay` (and, on
    verl 0.7, whose actor config has one too, the actor's)."""
    from omegaconf import OmegaConf
    from verl.workers import config as configs

    legacy = {}
    if "router_replay" in configs.FSDPActorConfig.__dataclass_fields__:  # verl 0.7
        legacy["router_replay"] = configs.RouterReplayConfig(mode=router_replay)
    return configs.FSDPActorConfig(
        strategy=strategy,
        fsdp_config=configs.FSDPEngineConfig(router_replay=configs.EngineRouterReplayConfig(mode=router_replay)),
        **legacy,
        ppo_mini_batch_size=MINI,
        ppo_micro_batch_size_per_gpu=MICRO,
        use_dynamic_bsz=False,
        ppo_epochs=1,
        rollout_n=1,
        clip_ratio=0.2,
        clip_ratio_high=0.28,
        entropy_coeff=0.0,
        calculate_entropy=True,
        use_kl_loss=False,
        policy_loss=OmegaConf.create({"loss_mode": "vanilla"}),
    )


def use_cpu_platform() -> None:
    """verl ≥ 0.8 picks a device platform (CUDA, NPU, ...): the test-only CPU one."""
    from verl.plugin.platform.platform_manager import set_platform
    from verl_cpu.platform import CPUPlatform

    set_platform(CPUPlatform())


def run_engine(model, rank: int, world: int, batches: str) -> None:
    """The engine worker path."""
    from verl.utils import tensordict_utils as tu
    from verl.workers import engine_workers
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.utils.padding import left_right_2_no_padding

    class CPUEngine(FSDPEngineWithLMHead):  # verl's engine code without FSDP sharding
        def __init__(self, module, optimizer):
            self.module, self.optimizer = module, optimizer
            self.ulysses_sequence_parallel_size = 1
            self.pad_to_length = None
            self._autocast_dtype = torch.float32
            self.use_ulysses_sp = False
            self.engine_config = SimpleNamespace(
                use_no_sync_for_gradient_accumulation=False,
                entropy_checkpointing=False,
                entropy_from_logits_with_chunking=False,
                entropy_from_logits_chunk_size=2048,
            )

        def train_mode(self, **kwargs):
            return nullcontext()

        def get_data_parallel_group(self):
            return None

        def get_data_parallel_size(self):
            return world

        def get_data_parallel_rank(self):
            return rank

        def is_mp_src_rank_with_outputs(self):
            return True  # no model parallelism: every rank returns its outputs

        def optimizer_step(self):
            for p in self.module.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= world
            self.optimizer.step()
            return 0.0

        def lr_scheduler_step(self):
            return 0.0

    use_cpu_platform()
    # R3: the engine replays the rollout's routing, and its worker marks the batches it trains on
    # (`enable_routing_replay`, below), as ActorRolloutRefWorker does for a Megatron or VeOmni actor
    # (verl/workers/engine_workers.py:62-72, 496-503, 710-716). verl's FSDP engine here does not
    # replay (the model is dense): what is checked is what reaches ppo_loss and what the hook reads.
    config = actor_config("fsdp2", router_replay="R3")
    engine = CPUEngine(model, torch.optim.SGD(model.parameters(), lr=0.5))
    worker = object.__new__(engine_workers.TrainingWorker)
    worker.engine = engine
    worker.engine_config = SimpleNamespace(
        use_dynamic_bsz=False,
        max_token_len_per_gpu=None,
        micro_batch_size_per_gpu=MICRO,
        use_fused_kernels=False,
        forward_only=False,
    )
    worker.model_config = {"use_remove_padding": False}
    off = lambda: False  # noqa: E731
    worker.profiler = SimpleNamespace(step=lambda: None, rank=rank, check_enable=off)  # profiling off
    worker.flops_counter = SimpleNamespace(estimate_flops=lambda *args, **kwargs: (0.0, 1.0))  # no MFU on a CPU
    worker.device_name = "cpu"
    worker.loss_fn = partial(engine_workers.ppo_loss, config=config)  # as ActorRolloutRefWorker.init_model binds it
    from verl import DataProto

    for step in range(1, STEPS + 1):  # RayPPOTrainer._update_actor's conversion, on this rank's share
        td = left_right_2_no_padding(DataProto.load_from_disk(batch_path(batches, step, rank)).to_tensordict())
        tu.assign_non_tensor(
            td,
            calculate_entropy=True,
            global_batch_size=MINI * world,
            mini_batch_size=MINI * world,
            epochs=1,
            seed=1,
            dataloader_kwargs={"shuffle": True},
            compute_loss=True,
            enable_routing_replay=True,
        )
        worker.train_mini_batch(td)


def run_dp_actor(model, rank: int, world: int, batches: str) -> None:
    """The legacy worker path: DataParallelPPOActor.update_policy."""
    from verl import DataProto
    from verl.workers.actor.dp_actor import DataParallelPPOActor

    config = actor_config("fsdp", router_replay="R3")  # which this actor does not apply
    actor = DataParallelPPOActor(config, model, torch.optim.SGD(model.parameters(), lr=0.5))
    for step in range(1, STEPS + 1):
        actor.update_policy(DataProto.load_from_disk(batch_path(batches, step, rank)))


def run_rank(rank: int, world: int, port: str, run_dir: str, path: str, batches: str) -> None:
    """One training rank: its gloo group, the hook imported as verl imports `external_lib`, and
    STEPS steps through verl's `path` ("engine" or "dp_actor") on its shares of `drive`'s batches."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, TRUSTLENS_DIR=run_dir)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from verl.utils.import_utils import import_external_libs

    import_external_libs("trustlens.integrations.verl")  # what verl does with model.external_lib
    model = tiny_qwen2()
    {"engine": run_engine, "dp_actor": run_dp_actor}[path](model, rank, world, batches)
    from trustlens.integrations.verl.state import STATE

    STATE["worker"].close()
    dist.destroy_process_group()


def default_path() -> str:
    """verl 0.9 trains through engine workers; 0.7's default is the legacy DataParallelPPOActor."""
    import verl
    from packaging.version import Version

    return "engine" if Version(verl.__version__) >= Version("0.8") else "dp_actor"


class Tokenizer:
    """Token ids as words "t<id>" (the tiny model has no tokenizer)."""

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(f"t{i}" for i in ids)


def drive(run_dir: str, world: int, batches: str) -> None:
    """verl's driver's part, through the hooks RayPPOTrainer gets: each step's batch goes through
    the hook of `_update_actor` (its samples recorded, the step and each row's sample id put in
    the batch), is split over the `world` ranks as verl's dispatch splits it (`DataProto.chunk`)
    and saved for them (`batch_path`); a metric per step. The run's final status is the caller's
    (`_ray_hooks.finish`), once the ranks have trained."""
    from omegaconf import OmegaConf
    from verl.utils.tracking import Tracking

    from trustlens.integrations.verl.driver import _log_samples

    os.environ["TRUSTLENS_DIR"] = run_dir
    actor = {"clip_ratio": 0.2, "clip_ratio_high": 0.28, "policy_loss": {}}
    # the rollout settings as verl's config holds them (vLLM, processed log-probs at τ = 0.7)
    rollout = {"name": "vllm", "temperature": 0.7, "top_p": 1.0, "top_k": -1, "logprobs_mode": "processed_logprobs"}
    config = OmegaConf.create({"actor_rollout_ref": {"actor": actor, "rollout": rollout}, "algorithm": {}})
    trainer = SimpleNamespace(
        config=config, tokenizer=Tokenizer(), actor_rollout_wg=SimpleNamespace(world_size=world), global_steps=0
    )
    model = tiny_qwen2()
    tracking = Tracking(project_name="verl_cpu", experiment_name="grpo", default_backend=[])
    Path(batches).mkdir(parents=True, exist_ok=True)
    for step in range(1, STEPS + 1):
        trainer.global_steps = step
        batch = make_batch(model, step, world)
        batch.batch["token_level_scores"] = torch.zeros_like(batch.batch["old_log_probs"])
        _log_samples(trainer, batch)
        for rank, share in enumerate(batch.chunk(world)):
            share.save_to_disk(batch_path(batches, step, rank))
        tracking.log({"actor/pg_loss": 0.5 * step, "note": "text is left out"}, step=step)
