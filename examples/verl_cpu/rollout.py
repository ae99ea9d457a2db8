"""A rollout backend for verl on HuggingFace `generate` (test-only): stands in for vLLM / SGLang /
TensorRT-LLM, none of which installs on a CPU machine, so that verl's own trainer rolls out.

verl ≥ 0.9 rolls out through "replicas": each is a server (a Ray actor) that generates token ids
and their log-probs for verl's agent loop, plus, in every training worker, an adapter through
which the trainer sends the server its new weights. The three pieces of
the rollout name `hf_cpu` (`actor_rollout_ref.rollout.name=hf_cpu`):

    HFServer         the server (`verl_cpu.server`): the policy model on the CPU, sampling one
                     request at a time with the sampled tokens' log-probs
    HFReplica        starts one HFServer per replica (verl: `RolloutReplicaRegistry`)
    HFServerAdapter  the training worker's side (verl: `get_rollout_class`); weight sync is a
                     copy: the replica's first worker sends the full fp32 state dict to its server
                     after every update, so the rollout samples from the policy being trained

`register()` adds `hf_cpu` to verl's two registries; it must run in every process that looks a
backend up (the trainer and the workers): `verl_cpu.plugin` calls it on import, and verl imports
`verl_cpu.plugin` in every process through `VERL_USE_EXTERNAL_MODULES`.
"""

from __future__ import annotations

import os
from typing import Any

import ray
from verl.workers.rollout import base
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry

from verl_cpu.server import NAME, HFServer, server_name


class HFReplica(RolloutReplica):
    """A replica served by one HFServer actor (any replica size: the model is not sharded)."""

    async def launch_servers(self) -> None:
        server = (
            ray.remote(HFServer)
            .options(name=server_name(self.replica_rank), num_cpus=0, max_concurrency=self.max_concurrency)
            .remote(self.config, self.model_config, self.replica_rank)
        )
        self.servers = [server]
        self._server_handle = server
        self._server_address = server_name(self.replica_rank)  # the router's key; no HTTP server


class HFServerAdapter(base.BaseRollout):
    """The training worker's end of the rollout: forwards the trainer's weights to its replica's
    server (the replica's first rank only; the others consume the weights for the collectives)."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ["RANK"])
        size = self.config.tensor_model_parallel_size * self.config.data_parallel_size
        size *= self.config.pipeline_model_parallel_size
        self.replica_rank = rank // size if replica_rank == -1 else replica_rank
        self.sends = rank % size == 0

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the hf_cpu rollout takes named tensors, not {wire_format}")
        state = {name: t.detach().to("cpu", copy=True) for name, t in weights}
        if self.sends:
            server = ray.get_actor(server_name(self.replica_rank))
            await server.update_weights.remote(state, kwargs.get("global_steps"))

    async def resume(self, tags: list[str]) -> None:
        """Weights and KV cache stay in memory on a CPU: nothing to resume."""

    async def release(self) -> None:
        """Nothing to release (see `resume`)."""


def register() -> None:
    """Make `actor_rollout_ref.rollout.name=hf_cpu` resolve in this process."""
    RolloutReplicaRegistry.register(NAME, lambda: HFReplica)
    base._ROLLOUT_REGISTRY[(NAME, "async")] = f"{__name__}.HFServerAdapter"
