"""The rollout engine: a separate copy of the policy that samples responses, like an inference server.

It holds its own copy of the weights in its own precision, samples with a KV cache at
temperature τ, and reports for every sampled token a_t what it believed:

    mu_logp[b, t]        = log μ(a_t)  with  μ = softmax(logits_engine / τ)     (nats)
    mu_topk_ids/logp     = μ's K most likely ids at t and their log μ, the sampled id forced in

The trainer recomputes the same quantities with its own float32 weights (`response_logits`);
the gap between the two is the training–inference mismatch the recorder measures. μ always
describes the policy that really sampled the tokens, unless `defect` plants a log-probability bug
(trustlens.train.engine_defects). Two sources of mismatch, as in real systems:

- Precision (`precision`): ``fp32``; ``fp32_exact``, the trainer's own numerics (below);
  ``bf16`` weights (as vLLM or SGLang serve them); ``fp8``
  W8A8 — every linear layer of the transformer blocks (a mixture of experts' experts too)
  computes with weights rounded to float8_e4m3fn (one scale per output channel, amax / 448, set
  at every weight sync) and inputs rounded to float8_e4m3fn (one dynamic scale per call, amax /
  448); embeddings, norms and the output layer are not quantised (as in vLLM's fp8 checkpoints),
  and an MoE router runs in bf16 (weights and inputs rounded to bfloat16, logits rounded to
  bfloat16 before the top-k), as the unquantised gate of an fp8 checkpoint does. This is
  simulated quantisation: the float8 values and scales are exact, and the matmuls accumulate in
  float32 as fp8 GEMMs do. The bf16 engine's router computes in bf16 as well, so at both
  precisions near-tied experts flip against the trainer's float32 router, as in real engines.
- Routing (mixture-of-experts models): the engine reports the experts it routed every position
  to (`Rollout.routed_experts`, trustlens.routing.replay), the input token's routing at each
  position of prompt and response, as vLLM and SGLang return them.
- Staleness (`lag` = k, asynchronous RL): the trainer calls `sync_weights` after every training
  step, and the engine serves the weights it received k syncs earlier (the starting weights
  until then), so rollouts of step t come from the policy of step t − k. The gap grows with how
  far the policy moves in k steps: a fast-moving policy is a stale one.

``fp32_exact`` is a batch-invariant, deterministic engine (vLLM `VLLM_BATCH_INVARIANT=1`, SGLang
`--enable-deterministic-inference`, verl's true on-policy mode): float32 weights, and every
position decoded by the trainer's own computation, a full forward pass without a KV cache over a
buffer of the final shape (B, P + max_new_tokens), responses padded to max_new_tokens. A
position's logits depend on the positions before it only (causal attention; masked keys add
exact zeros), so they are the bits the trainer's forward over the finished batch gives, and log μ
equals log π_old bit for bit (`trustlens certify`). The ``fp32`` engine decodes with a KV cache:
other matrix shapes, other rounding (|Δ log p| up to ~1e-5 nats on a few % of the tokens).

`logit_noise` adds Gaussian noise (standard deviation in logit units, before the division by τ)
to the engine's logits, imitating a noisier inference engine; μ is then the noisy distribution
the tokens were really drawn from.

Sequence layout shared with the trainer: prompts are left-padded to a common length P, responses
right-padded to a common length T, so `input_ids` is (B, P + T) and the logits that predict the
response are those at positions P − 1 … P + T − 2.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections import deque
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from trustlens.routing.replay import DENSE, last_logits, position_ids, routers, routing
from trustlens.train.engine_defects import check_defect, engine_token, merged_offset, sampling_support, split_k_hook
from trustlens.train.rollout_batch import Rollout

# name -> compute dtype
PRECISIONS = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp32_exact": torch.float32, "fp8": torch.float32}
EXACT = "fp32_exact"  # the precision whose engine decodes with the trainer's numerics (module docstring)
FP8 = torch.float8_e4m3fn  # the 8-bit float format of the fp8 engine
FP8_MAX = float(torch.finfo(FP8).max)  # 448: the largest finite float8_e4m3fn


@dataclass
class RolloutConfig:
    temperature: float = 1.0  # sampling temperature τ; μ and π are both softmax(logits / τ)
    max_new_tokens: int = 32  # response length cap, in tokens (eos included)
    topk: int = 20  # K: how many of μ's most likely ids are kept per token (sampled id forced in)
    precision: str = "bf16"  # the engine's precision: "bf16" (default), "fp32", "fp32_exact" or "fp8" (see above)
    logit_noise: float = 0.0  # std of Gaussian noise added to the engine's logits (0 = none)
    lag: int = 0  # k: the engine serves the weights of k `sync_weights` calls ago (0 = current)
    defect: str = "clean"  # a planted log-probability bug (trustlens.train.engine_defects); "clean" = none

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {self.precision!r}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be ≥ 1, got {self.max_new_tokens}")
        if self.topk < 1:
            raise ValueError(f"topk must be ≥ 1, got {self.topk}")
        if self.logit_noise < 0:
            raise ValueError(f"logit_noise must be ≥ 0, got {self.logit_noise}")
        if self.lag < 0:
            raise ValueError(f"lag must be ≥ 0, got {self.lag}")
        check_defect(self.defect)


def response_logits(model: torch.nn.Module, batch: Rollout, temperature: float) -> torch.Tensor:
    """The model's logits / τ at the positions that predict each response token. (B, T, V)

    One full forward pass without a cache: this is how the trainer computes π_old and π.
    """
    return last_logits(model, batch.input_ids, batch.attention_mask, batch.response_ids.shape[1], temperature)


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id lists as a left-padded (B, P) long tensor and its 0/1 attention mask."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token-id lists")
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), P), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, P - len(p) :] = 1
    return ids, mask


def fp8_round(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """`x` rounded to float8_e4m3fn with scale amax(|x|) / 448 (over `dim`, or the whole tensor),
    returned in x's dtype: the values an fp8 kernel computes with."""
    amax = x.abs().amax() if dim is None else x.abs().amax(dim=dim, keepdim=True)
    scale = (amax.float() / FP8_MAX).clamp(min=1e-12)
    return ((x.float() / scale).to(FP8).float() * scale).to(x.dtype)


def _fp8_input_hook(module: torch.nn.Module, args: tuple) -> tuple:
    return (fp8_round(args[0]), *args[1:])


def _bf16_input_hook(module: torch.nn.Module, args: tuple) -> tuple:
    return (args[0].to(torch.bfloat16).to(args[0].dtype), *args[1:])


def _quantised_linears(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The layers the fp8 engine quantises: the linear layers of the transformer blocks (not
    lm_head), and the experts of a mixture of experts (their 3-d weights, (E, out, in))."""
    return {
        name: m
        for name, m in model.named_modules()
        if (isinstance(m, torch.nn.Linear) and name.split(".")[-1] != "lm_head") or type(m).__name__.endswith("Experts")
    }


@functools.cache
def _cache_argument() -> str:
    """The name of the KV-cache argument of the installed transformers' causal LMs (the built-in
    model is a Llama): `cache` from transformers 5.2x on, where `past_key_values` is deprecated,
    else `past_key_values`."""
    from transformers import LlamaForCausalLM

    return "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"


class RolloutEngine:
    """Samples responses from its own (low-precision, possibly stale) copy of a causal LM, with a
    KV cache."""

    def __init__(self, model: torch.nn.Module, config: RolloutConfig, *, eos_id: int, pad_id: int) -> None:
        self.config = config
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        # Cast the weights only: float buffers such as rotary frequencies stay float32, as an
        # inference server keeps them.
        dtype = PRECISIONS[config.precision]
        for p in self.model.parameters():
            p.data = p.data.to(dtype)
        self._behind: dict[str, torch.Tensor] | None = None  # θ_0 − θ_r after a `resume` restart, else None
        self._fp8_weights: set[str] = set()
        self._bf16_weights: set[str] = set()
        self._routed = bool(routers(self.model))  # a mixture of experts: report its routing
        if config.precision == "fp8":
            for name, layer in _quantised_linears(self.model).items():
                layer.register_forward_pre_hook(_fp8_input_hook)
                self._fp8_weights.update(f"{name}.{p}" for p, w in layer.named_parameters() if w.dim() >= 2)
            for router in routers(self.model).values():
                router.register_forward_pre_hook(_bf16_input_hook)
                self._bf16_weights.update(n for n, p in self.model.named_parameters() if p is router.weight)
            self._load({n: p.detach() for n, p in model.named_parameters()})
        if config.defect == "batch_variant":
            head = next(m for name, m in self.model.named_modules() if name.split(".")[-1] == "lm_head")
            head.register_forward_hook(split_k_hook)
        self._pending: deque[dict[str, torch.Tensor]] = deque()  # weights not served yet (lag)
        self._merges = 0  # syncs that merged the adapter again (the frozen_policy defect)

    @torch.no_grad()
    def sync_weights(self, trainer_model: torch.nn.Module) -> None:
        """Hand the trainer's current weights to the engine. With lag k the engine then serves the
        weights of k syncs ago (the starting ones until k syncs have happened)."""
        source = {name: p.detach() for name, p in trainer_model.named_parameters()}
        for name, p in self.model.named_parameters():
            if name not in source or source[name].shape != p.shape:
                raise ValueError(f"sync_weights: trainer model has no parameter {name!r} of shape {tuple(p.shape)}")
        self._merges += self.config.defect == "frozen_policy"
        if self.config.lag == 0:
            self._load(source)
            return
        self._pending.append({name: t.clone() for name, t in source.items()})
        if len(self._pending) > self.config.lag:
            self._load(self._pending.popleft())

    @torch.no_grad()
    def restart(self, start: torch.nn.Module, trainer_model: torch.nn.Module) -> None:
        """The `resume` defect's engine restart: a fresh engine holding `start`'s weights θ_0 (the
        warm start) instead of the trainer's θ_r, and no weights pending. It takes every later sync
        as a delta to what it holds, so it serves θ + (θ_0 − θ_r) from then on."""
        now = {name: p.detach() for name, p in trainer_model.named_parameters()}
        first = dict(start.named_parameters())
        self._behind = {name: first[name].detach() - w for name, w in now.items()}
        self._pending.clear()
        self._load(now)

    @torch.no_grad()
    def _load(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy `weights` into the engine (plus θ_0 − θ_r after a `resume` restart), cast to its
        precision (fp8-rounded where it quantises)."""
        for name, p in self.model.named_parameters():
            w = weights[name] if self._behind is None else weights[name] + self._behind[name]
            if name in self._bf16_weights:
                w = w.to(torch.bfloat16)
            p.copy_(fp8_round(w.float(), dim=-1) if name in self._fp8_weights else w)

    def _next_logits(self, logits: torch.Tensor, generator: torch.Generator | None, noise: bool) -> torch.Tensor:
        """The engine's last-position logits as float32, with the optional noise. (B, V)"""
        logits = logits.float()
        if self._merges:  # the adapter's delta, merged once per sync
            logits = logits + self._merges * merged_offset(logits.shape[-1])
        if noise and self.config.logit_noise > 0:
            draw = torch.randn(logits.shape, generator=generator, dtype=logits.dtype)
            logits = logits + self.config.logit_noise * draw
        return logits

    def _prefill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """The logits at each prompt's last position (B, V) and the decoding state `_advance`
        carries on: the exact precision keeps the whole buffer in the trainer's shape (prompt,
        then max_new_tokens of padding) and reruns it without a cache; the others prefill a KV
        cache and decode one position at a time."""
        B, P = prompt_ids.shape
        if self.config.precision == EXACT:
            n = self.config.max_new_tokens
            buffer = torch.cat([prompt_ids, torch.full((B, n), self.pad_id)], 1)
            mask = torch.cat([prompt_mask, torch.zeros((B, n), dtype=torch.long)], 1)
            out = self.model(input_ids=buffer, attention_mask=mask, position_ids=position_ids(mask), use_cache=False)
            return out.logits[:, P - 1], {"buffer": buffer, "mask": mask}
        cache = {_cache_argument(): DynamicCache()}
        pos = position_ids(prompt_mask)
        out = self.model(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            position_ids=pos,
            use_cache=True,
            logits_to_keep=1,
            **cache,
        )
        return out.logits[:, -1], {"cache": cache, "mask": prompt_mask, "pos": pos[:, -1:]}

    def _advance(self, state: dict, tok: torch.Tensor, alive: torch.Tensor, at: int) -> torch.Tensor:
        """Append the sampled tokens (B,) at buffer position `at` (alive (B,): rows still
        generating) and return the next position's logits (B, V); `state` is `_prefill`'s."""
        if "buffer" in state:
            buffer, mask = state["buffer"], state["mask"]
            buffer[:, at] = tok
            mask[:, at] = alive.long()
            out = self.model(input_ids=buffer, attention_mask=mask, position_ids=position_ids(mask), use_cache=False)
            return out.logits[:, at]
        state["mask"] = torch.cat([state["mask"], alive.long()[:, None]], dim=1)
        state["pos"] = state["pos"] + 1
        out = self.model(
            input_ids=tok[:, None],
            attention_mask=state["mask"],
            position_ids=state["pos"],
            use_cache=True,
            **state["cache"],
        )
        return out.logits[:, -1]

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        *,
        generator: torch.Generator | None = None,
        greedy: bool = False,
    ) -> Rollout:
        """Sample one response per prompt (repeat a prompt G times for a GRPO group).

        greedy=True takes the argmax of the noiseless logits instead of sampling (evaluation of
        the policy itself); μ is still reported at τ.
        Generation stops when every row has emitted eos or after max_new_tokens tokens.
        """
        if not self._routed:
            return self._generate(prompts, generator, greedy)
        # the router's logits in bf16 at either reduced precision (bf16 computes them so already)
        router_dtype = torch.bfloat16 if self.config.precision == "fp8" else None
        with routing(self.model, router_dtype=router_dtype) as trace:
            batch = self._generate(prompts, generator, greedy)
        fed = trace.routed_experts(len(batch))  # (B, P + fed, L, k): the positions the engine fed
        experts = torch.full((*batch.input_ids.shape, *fed.shape[2:]), DENSE, dtype=torch.long)
        experts[:, : fed.shape[1]] = fed
        batch.routed_experts = experts
        return batch

    def _generate(self, prompts: list[list[int]], generator: torch.Generator | None, greedy: bool) -> Rollout:
        cfg = self.config
        prompt_ids, prompt_mask = left_pad(prompts, self.pad_id)
        B, P = prompt_ids.shape
        exact = cfg.precision == EXACT
        last, state = self._prefill(prompt_ids, prompt_mask)  # (B, V)
        finished = torch.zeros(B, dtype=torch.bool)
        tokens, alive, logps, top_ids, top_logps, supports = [], [], [], [], [], []
        for t in range(cfg.max_new_tokens):
            logits = self._next_logits(last, generator, noise=not greedy)  # (B, V)
            tok, logp, ids_k, logp_k = engine_token(
                logits,
                temperature=cfg.temperature,
                topk=cfg.topk,
                defect=cfg.defect,
                generator=generator,
                greedy=greedy,
            )
            supports.append(sampling_support(logits, temperature=cfg.temperature, defect=cfg.defect))
            tok = torch.where(finished, torch.full_like(tok, self.pad_id), tok)
            tokens.append(tok)
            alive.append(~finished)
            logps.append(torch.where(finished, torch.zeros_like(logp), logp))
            top_ids.append(ids_k)
            top_logps.append(logp_k)
            finished = finished | (tok == self.eos_id)
            if bool(finished.all()) or t + 1 == cfg.max_new_tokens:
                break
            last = self._advance(state, tok, alive[-1], P + t)
        if exact:  # padded to max_new_tokens: the trainer's forward has the engine's shape
            short = cfg.max_new_tokens - len(tokens)
            tokens += [torch.full_like(tokens[-1], self.pad_id)] * short
            alive += [torch.zeros_like(alive[-1])] * short
            logps += [torch.zeros_like(logps[-1])] * short
            top_ids += [top_ids[-1]] * short  # a valid top-K of the last position: masked out
            top_logps += [top_logps[-1]] * short
            supports += [supports[-1]] * short
        response_ids = torch.stack(tokens, 1)
        response_mask = torch.stack(alive, 1)
        return Rollout(
            input_ids=torch.cat([prompt_ids, response_ids], 1),
            attention_mask=torch.cat([prompt_mask, response_mask.long()], 1),
            prompt_len=P,
            response_ids=response_ids,
            response_mask=response_mask,
            mu_logp=torch.stack(logps, 1),
            mu_topk_ids=torch.stack(top_ids, 1),
            mu_topk_logp=torch.stack(top_logps, 1).float(),
            support=None if supports[0] is None else torch.stack(supports, 1),  # type: ignore[arg-type]
        )
