"""The `hf_cpu` rollout's server (test-only; see `verl_cpu.rollout`): one Ray actor per rollout
replica, holding the policy model on the CPU, that samples with HuggingFace `generate` where verl
would ask vLLM. `log_probs` are the sampled tokens' log-probs under the distribution it samples
from: temperature-scaled, EOS held back for the first MIN_NEW_TOKENS tokens (top-k / top-p are
not applied).

This module imports verl only inside methods: a fresh Ray worker imports it to build the actor,
and verl's own import then imports `verl_cpu.plugin`, which imports `verl_cpu.rollout`, which
needs this module complete.
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "hf_cpu"
# Responses are at least this many tokens before EOS: a random tiny model would otherwise end many
# at once, and an empty response gives the trainer no token to learn from. (Identical responses are
# fine: the trustlens driver hook hands every row its own sample id.)
MIN_NEW_TOKENS = 2


def server_name(replica_rank: int) -> str:
    """The Ray actor name of a replica's server (the adapter in the workers finds it by name)."""
    return f"{NAME}_server_{replica_rank}"


class HFServer:
    """One rollout replica's server: token ids in, sampled token ids and their log-probs out."""

    def __init__(self, config: Any, model_config: Any, replica_rank: int) -> None:
        from transformers import AutoModelForCausalLM
        from verl.utils.fs import copy_to_local

        torch.set_num_threads(1)
        torch.manual_seed(config.seed + replica_rank)
        self.config = config
        self.model = AutoModelForCausalLM.from_pretrained(
            copy_to_local(model_config.path), torch_dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
        self.eos = self.model.generation_config.eos_token_id
        self.global_steps: int | None = None

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str, **multimodal: Any
    ) -> Any:
        """Sample one response (verl's server API: the multi-modal arguments are not supported)."""
        if any(multimodal.get(k) is not None for k in ("image_data", "video_data", "audio_data")):
            raise NotImplementedError("the hf_cpu rollout takes text prompts only")
        budget = self.config.prompt_length + self.config.response_length - len(prompt_ids)
        max_tokens = sampling_params.get("max_tokens", min(self.config.response_length, budget))
        temperature = float(sampling_params.get("temperature", 1.0))
        ids = torch.tensor([prompt_ids])
        with torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=temperature > 0,
                temperature=temperature if temperature > 0 else None,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max(1, max_tokens),
                min_new_tokens=min(MIN_NEW_TOKENS, max(1, max_tokens)),
                eos_token_id=self.eos,
                pad_token_id=self.eos if isinstance(self.eos, int) else None,
                output_scores=True,
                return_dict_in_generate=True,
            )
        tokens = out.sequences[0, ids.shape[1] :]
        # the scores generate sampled from: logits / τ, EOS held back while the response is short
        scores = torch.stack(out.scores, 1)[0, : len(tokens)].float()
        log_probs = torch.log_softmax(scores, -1).gather(-1, tokens[:, None])[:, 0]
        from verl.workers.rollout.replica import TokenOutput

        return TokenOutput(
            token_ids=tokens.tolist(),
            log_probs=log_probs.tolist() if sampling_params.get("logprobs") else None,
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},
        )

    async def update_weights(self, state: dict[str, torch.Tensor], global_steps: int | None) -> None:
        """Load the trainer's weights (HF names; a tied lm_head may be missing)."""
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if k != "lm_head.weight"]:
            raise RuntimeError(f"weights do not match the rollout model: {missing=} {unexpected=}")
        self.global_steps = global_steps

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def _nothing(self, *args: Any, **kwargs: Any) -> None:
        """Memory and scheduling controls of a GPU engine: nothing to do for a CPU model."""

    wake_up = sleep = clear_kv_cache = release_kv_cache = resume_kv_cache = _nothing
    abort_all_requests = resume_generation = start_profile = stop_profile = _nothing
