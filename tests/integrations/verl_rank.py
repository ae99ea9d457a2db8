"""One gloo rank of the verl hook test (tests/integrations/test_verl.py), run as a script:

    python verl_rank.py RANK WORLD PORT RUN_DIR OUT_JSON PATH

PATH is `engine` or `dp_actor`:

It builds a tiny Qwen2 from a config (no hub), a GRPO-like batch of this rank's samples, and runs
two training steps through verl's own actor code with the trustlens hook imported the way
`external_lib` imports it:

- `engine` (verl 0.9's default worker): `TrainingWorker.train_mini_batch` → `train_batch` → the FSDP engine's
  `forward_backward_batch` / `forward_step` / `prepare_model_inputs` / `prepare_model_outputs` →
  `losses.ppo_loss`. The engine is verl's `FSDPEngineWithLMHead` without its constructor (no
  FSDP sharding on a CPU): the model is a plain module and `optimizer_step` averages the gradients
  over gloo itself.
- `dp_actor` (verl 0.7's default, legacy FSDP worker): `DataParallelPPOActor.update_policy` on a
  `DataProto`.

Every call of verl's policy loss is spied on (its registry entry wrapped), and the tensors it got
(log π, π_old, advantages, response mask) are written to OUT_JSON for the test to compare with
the recorded run.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import nullcontext
from functools import partial
from types import SimpleNamespace

import torch
import torch.distributed as dist
from tiny import VOCAB as V
from tiny import tiny_qwen2

B, P, R = 8, 5, 6  # samples per rank, prompt and response widths
STEPS, MINI, MICRO = 2, 4, 2  # training steps; mini- and micro-batch sizes per rank


def tiny_model():
    return tiny_qwen2()


def make_batch(model, rank: int, step: int):
    """A left-padded prompt / right-padded response batch (B, P + R) of distinct samples, with
    π_old from the model, μ = π_old + noise and per-sequence advantages (two of them 0)."""
    from verl import DataProto

    g = torch.Generator().manual_seed(1000 * step + rank)
    prompt_len = torch.randint(2, P + 1, (B,), generator=g)
    resp_len = torch.randint(2, R + 1, (B,), generator=g)
    input_ids = torch.zeros(B, P + R, dtype=torch.long)
    attention = torch.zeros(B, P + R, dtype=torch.long)
    for i in range(B):
        input_ids[i, P - prompt_len[i] : P] = torch.randint(1, V, (int(prompt_len[i]),), generator=g)
        input_ids[i, P : P + resp_len[i]] = torch.randint(1, V, (int(resp_len[i]),), generator=g)
        attention[i, P - prompt_len[i] : P + resp_len[i]] = 1
    position_ids = (attention.cumsum(1) - 1).clamp(min=0)
    responses = input_ids[:, P:]
    response_mask = attention[:, P:].clone()
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids).logits
        logp = torch.log_softmax(logits[:, P - 1 : -1].float(), -1).gather(-1, responses[..., None])[..., 0]
    old = logp * response_mask
    mu = (old + 0.05 * torch.randn(old.shape, generator=g)).clamp(max=0) * response_mask
    adv = torch.randn(B, generator=g)
    adv[:2] = 0.0
    batch = DataProto.from_dict(
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
        },
        meta_info={"temperature": 1.0, "trustlens_step": step},
    )
    return batch


def spy_policy_loss(calls: list):
    """Wrap verl's vanilla policy loss so that every call's tensors are kept."""
    from verl.trainer.ppo import core_algos

    original = core_algos.POLICY_LOSS_REGISTRY["vanilla"]

    def spy(old_log_prob, log_prob, advantages, response_mask, **kwargs):
        m = response_mask.bool()
        calls.append(
            {
                "pi": log_prob.detach()[m].tolist(),
                "old": old_log_prob.detach()[m].tolist(),
                "adv": advantages.detach()[m].tolist(),
            }
        )
        return original(
            old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask, **kwargs
        )

    core_algos.POLICY_LOSS_REGISTRY["vanilla"] = spy


def actor_config(strategy: str):
    from omegaconf import OmegaConf
    from verl.workers.config import FSDPActorConfig

    return FSDPActorConfig(
        strategy=strategy,
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
    """verl ≥ 0.8 picks a device platform (CUDA, NPU, ...); a test-only one for the CPU."""
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import set_platform

    class CPUPlatform(PlatformBase):
        device_name = "cpu"
        vendor_name = "cpu"
        device_module = torch.cpu

        def is_available(self):
            return True

        def current_device(self):
            return "cpu"

        def device_count(self):
            return 1

        def set_device(self, device_index):
            pass

        def synchronize(self, device_index=None):
            pass

        def manual_seed(self, seed):
            torch.manual_seed(seed)

        def manual_seed_all(self, seed):
            torch.manual_seed(seed)

        def empty_cache(self):
            pass

        def communication_backend_name(self):
            return "gloo"

    # the rest of the device interface is never reached on this path
    unused = ("cudart", "get_device_capability", "is_ipc_supported", "nvtx_range", "profiler_start", "profiler_stop")
    unused += ("ray_noset_envvars", "ray_resource_name", "set_allocator_settings", "visible_devices_envvar")
    for name in unused:
        setattr(CPUPlatform, name, lambda self, *args, **kwargs: None)
    CPUPlatform.__abstractmethods__ = frozenset()
    set_platform(CPUPlatform())


def run_engine(model, rank: int, world: int) -> None:
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
            return False

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
    config = actor_config("fsdp2")
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
    worker.loss_fn = partial(engine_workers.ppo_loss, config=config)  # as ActorRolloutRefWorker.init_model binds it
    for step in range(1, STEPS + 1):
        td = left_right_2_no_padding(make_batch(model, rank, step).to_tensordict())
        tu.assign_non_tensor(
            td,
            calculate_entropy=True,
            global_batch_size=MINI * world,
            mini_batch_size=MINI * world,
            epochs=1,
            seed=1,
            dataloader_kwargs={"shuffle": True},
            compute_loss=True,
        )
        worker.train_mini_batch(td)


def run_dp_actor(model, rank: int, world: int) -> None:
    """The legacy worker path: DataParallelPPOActor.update_policy."""
    from verl.workers.actor.dp_actor import DataParallelPPOActor

    config = actor_config("fsdp")
    actor = DataParallelPPOActor(config, model, torch.optim.SGD(model.parameters(), lr=0.5))
    for step in range(1, STEPS + 1):
        actor.update_policy(make_batch(model, rank, step))


def main() -> None:
    rank, world, port, run_dir, out, path = int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:7]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, TRUSTLENS_DIR=run_dir)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from verl.utils.import_utils import import_external_libs

    import_external_libs("trustlens.integrations.verl")  # what verl does with model.external_lib
    calls: list = []
    spy_policy_loss(calls)
    model = tiny_model()
    {"engine": run_engine, "dp_actor": run_dp_actor}[path](model, rank, world)
    from trustlens.integrations import verl as hook

    hook._state["worker"].close()
    with open(out, "w") as f:
        json.dump(calls, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
