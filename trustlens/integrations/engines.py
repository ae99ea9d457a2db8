"""The rollout engines' own outputs as what `TokenRecorder.record` takes: vLLM's and SGLang's.

    from trustlens.integrations.engines import from_vllm
    outputs = llm.generate(prompts, SamplingParams(temperature=0.7, logprobs=20))
    mu = from_vllm(outputs, topk=20)
    recorder.record(step, **mu.record_args(), pi_logp=..., advantages=...)

- `from_vllm(outputs)`: vLLM's `RequestOutput`s (every one of their `.outputs`, in order) or
  `CompletionOutput`s. Per response it reads `token_ids` and `logprobs`, a list with one
  {token_id: Logprob(logprob, rank, decoded_token)} per generated token (vllm/logprobs.py:
  `SampleLogprobs`; the `FlatLogprobs` container of recent versions reads the same). vLLM always
  puts the sampled token in that position's dict, beside the `SamplingParams(logprobs=K)` most
  likely ones; a dict without it means the outputs and the ids do not belong together, and is a
  ValueError naming the response and the position.
- `from_sglang(responses)`: SGLang `/generate` JSON (`return_logprob=True`, `top_logprobs_num=K`),
  one dict per response (or one dict): `meta_info.output_token_logprobs` is a list of
  [logprob, token_id, text] per generated token (text is null unless `return_text_in_logprobs`),
  `meta_info.output_top_logprobs` per token a list of such triples, most likely first.

Both return `EngineTokens`, right-padded to the longest response (or to `length`):

    token_ids      (B, T) int64    the sampled ids; `pad_id` (default 0) after each response
    response_mask  (B, T) bool     True on the generated tokens
    mu_logp        (B, T) float32  log μ(a_t) as the engine reported it; 0.0 on padding
    mu_topk_ids    (B, T, K) int64 with `topk=K`: μ's K most likely ids of the position, most likely
                                   first, the sampled id forced in (it replaces the K-th when it is
                                   not among them, as docs/rules.md asks); else None
    mu_topk_logp   (B, T, K) float32 their log μ

Where an engine gave fewer than K ids at a position (a vocabulary smaller than K, a server that
trims), the set is filled with ids it does not hold at log μ = −inf (probability 0); on padding
the top-K is ids 0..K−1 at −inf. The log-probs are the engine's: raw or processed, at its
temperature or not, as its settings made them (say which in TokenRecorder's `sampling`;
`vllm_sampling` and `sglang_sampling` read them from the engines' settings).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trustlens.core.values import check_attributes, check_optional_int, check_sequence, check_type
from trustlens.run.manifest import normalise_sampling

# vLLM's `logprobs_mode` values -> run.json sampling["logprobs"]
VLLM_LOGPROBS_MODES = {
    "raw_logprobs": "raw",
    "raw_logits": "raw",
    "processed_logprobs": "processed",
    "processed_logits": "processed",
}


@dataclass
class EngineTokens:
    """A batch of responses as an engine reported them (shapes and pad values: module docstring)."""

    token_ids: torch.Tensor  # (B, T) int64
    response_mask: torch.Tensor  # (B, T) bool
    mu_logp: torch.Tensor  # (B, T) float32
    mu_topk_ids: torch.Tensor | None = None  # (B, T, K) int64
    mu_topk_logp: torch.Tensor | None = None  # (B, T, K) float32

    def record_args(self) -> dict[str, torch.Tensor]:
        """The keyword arguments of `TokenRecorder.record` these tensors fill."""
        args = {"token_ids": self.token_ids, "response_mask": self.response_mask, "mu_logp": self.mu_logp}
        if self.mu_topk_ids is not None and self.mu_topk_logp is not None:
            args.update(mu_topk_ids=self.mu_topk_ids, mu_topk_logp=self.mu_topk_logp)
        return args


# one response: its ids, log μ of each, and per position the engine's (id, log μ) candidates
_Response = tuple[list[int], list[float], list[list[tuple[int, float]]]]


def from_vllm(
    outputs: Sequence[Any], *, topk: int | None = None, pad_id: int = 0, length: int | None = None
) -> EngineTokens:
    """`EngineTokens` of vLLM's RequestOutputs or CompletionOutputs (module docstring). topk: K
    of μ's top-K to return (None: none); length: pad to this T (≥ the longest response)."""
    check_optional_int("topk", topk, low=1)
    completions = _vllm_completions(outputs)
    responses: list[_Response] = []
    for b, completion in enumerate(completions):
        ids = [_token_id(f"outputs[{b}].token_ids", i) for i in completion.token_ids]
        positions = completion.logprobs
        if positions is None:
            raise ValueError(
                f"response {b} has logprobs=None: ask vLLM for them (SamplingParams(logprobs=K), "
                "K = 0 for the sampled token's alone)"
            )
        if len(positions) != len(ids):
            raise ValueError(f"response {b} has {len(ids)} token_ids but logprobs for {len(positions)} positions")
        logps, candidates = [], []
        for t, (token, entry) in enumerate(zip(ids, positions, strict=True)):
            if entry is None or token not in entry:
                raise ValueError(
                    f"response {b}, position {t}: the logprobs lack the sampled token {token} (vLLM always "
                    "includes it): are these logprobs of another output?"
                )
            logps.append(_logp(f"response {b}, position {t}", entry[token].logprob))
            # most likely first: by rank where vLLM gave one, else by log-prob
            ranked = sorted(entry.items(), key=lambda kv: (_rank(kv[1]), -float(kv[1].logprob)))
            candidates.append([(int(i), _logp(f"response {b}, position {t}", lp.logprob)) for i, lp in ranked])
        responses.append((ids, logps, candidates))
    return _pad(responses, topk=topk, pad_id=pad_id, length=length)


def from_sglang(
    responses: Sequence[Mapping[str, Any]] | Mapping[str, Any],
    *,
    topk: int | None = None,
    pad_id: int = 0,
    length: int | None = None,
) -> EngineTokens:
    """`EngineTokens` of SGLang /generate responses (module docstring): one dict or a list of
    them. topk: K of μ's top-K to return (None: none); length: pad to this T."""
    check_optional_int("topk", topk, low=1)
    if isinstance(responses, Mapping):
        responses = [responses]
    responses = check_sequence("responses", responses, what="an SGLang /generate response (a dict) or a list of them")
    rows: list[_Response] = []
    for b, response in enumerate(responses):
        meta = response.get("meta_info") if isinstance(response, Mapping) else None
        if not isinstance(meta, Mapping) or meta.get("output_token_logprobs") is None:
            raise ValueError(
                f"response {b} has no meta_info.output_token_logprobs: call /generate with return_logprob=true"
            )
        tokens = meta["output_token_logprobs"]
        ids = [_token_id(f"response {b}, position {t}", entry[1]) for t, entry in enumerate(tokens)]
        logps = [_logp(f"response {b}, position {t}", entry[0]) for t, entry in enumerate(tokens)]
        top = meta.get("output_top_logprobs")
        if topk is not None and top is None:
            raise ValueError(
                f"response {b} has no meta_info.output_top_logprobs: call /generate with top_logprobs_num=K"
            )
        if top is not None and len(top) != len(ids):
            raise ValueError(f"response {b} has {len(ids)} output tokens but output_top_logprobs for {len(top)}")
        candidates = [
            [
                (_token_id(f"response {b}, position {t}", e[1]), _logp(f"response {b}, position {t}", e[0]))
                for e in pos or ()
            ]
            for t, pos in enumerate(top or [None] * len(ids))
        ]
        rows.append((ids, logps, candidates))
    return _pad(rows, topk=topk, pad_id=pad_id, length=length)


def vllm_sampling(params: Any, logprobs_mode: str | None = None) -> dict[str, Any]:
    """TokenRecorder's `sampling` from a vLLM SamplingParams (or anything with its temperature,
    top_p, top_k, min_p) and the engine's `logprobs_mode` (vLLM V1's default "raw_logprobs"; None:
    not known)."""
    if logprobs_mode is not None and logprobs_mode not in VLLM_LOGPROBS_MODES:
        raise ValueError(
            f"logprobs_mode must be one of {', '.join(VLLM_LOGPROBS_MODES)} or None, got {logprobs_mode!r}"
        )
    check_attributes("params", params, ("temperature", "top_p"), "a vLLM SamplingParams")
    sampling = {key: getattr(params, key, None) for key in ("temperature", "top_p", "top_k", "min_p")}
    return checked_sampling(
        {**sampling, "logprobs": None if logprobs_mode is None else VLLM_LOGPROBS_MODES[logprobs_mode]}
    )


def sglang_sampling(sampling_params: Mapping[str, Any], logprobs: str | None = None) -> dict[str, Any]:
    """TokenRecorder's `sampling` from the `sampling_params` of a /generate request (SGLang's
    defaults where a key is absent: temperature 1, top_p 1, top_k −1, min_p 0); `logprobs`: "raw"
    or "processed" as the server computes them, None when not known."""
    check_type("sampling_params", sampling_params, Mapping, "the sampling_params mapping of a /generate request")
    defaults = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0}
    return checked_sampling(
        {**{key: sampling_params.get(key, value) for key, value in defaults.items()}, "logprobs": logprobs}
    )


def checked_sampling(sampling: dict[str, Any]) -> dict[str, Any]:
    """`sampling` as given, once `normalise_sampling` (what TokenRecorder's `sampling=` checks)
    accepts it: a bad setting is refused where it is read from the engine's configuration,
    naming the key, not later when the recorder opens the run."""
    normalise_sampling(sampling)
    return sampling


def _vllm_completions(outputs: Sequence[Any]) -> list[Any]:
    """Every CompletionOutput: those of each RequestOutput in order, or the outputs themselves."""
    if isinstance(outputs, (str, bytes, Mapping)) or not isinstance(outputs, Sequence):
        raise ValueError(
            f"outputs must be a list of vLLM RequestOutputs or CompletionOutputs, got {type(outputs).__name__}"
        )
    completions = []
    for i, out in enumerate(outputs):
        if hasattr(out, "outputs"):
            completions.extend(out.outputs)
        elif hasattr(out, "token_ids") and hasattr(out, "logprobs"):
            completions.append(out)
        else:
            raise ValueError(
                f"outputs[{i}] is a {type(out).__name__}, not a vLLM RequestOutput (with .outputs) or "
                "CompletionOutput (with .token_ids and .logprobs)"
            )
    return completions


def _rank(logprob: Any) -> float:
    rank = getattr(logprob, "rank", None)
    return math.inf if rank is None else float(rank)


def _token_id(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
        raise ValueError(f"{where}: token id must be an int in [0, 2³¹), got {value!r}")
    return value


def _logp(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value > 1e-4:
        raise ValueError(f"{where}: log-probability must be a number ≤ 0 (−inf allowed), got {value!r}")
    return min(float(value), 0.0)


def _top_k(token: int, logp: float, candidates: list[tuple[int, float]], k: int) -> tuple[list[int], list[float]]:
    """The K most likely of `candidates` (most likely first), `token` forced in (it replaces the
    K-th), filled with ids not held at −inf when fewer than K."""
    ids: list[int] = []
    logps: list[float] = []
    for i, lp in candidates:
        if i not in ids and len(ids) < k:
            ids.append(i)
            logps.append(lp)
    if token not in ids:
        if len(ids) == k:
            ids.pop()
            logps.pop()
        ids.append(token)
        logps.append(logp)
    fill = (i for i in range(2 * k + 1) if i not in ids)
    while len(ids) < k:
        ids.append(next(fill))
        logps.append(-math.inf)
    return ids, logps


def _pad(responses: list[_Response], *, topk: int | None, pad_id: int, length: int | None) -> EngineTokens:
    if not responses:
        raise ValueError("no responses: outputs/responses must hold at least one")
    pad_id = _token_id("pad_id", pad_id)
    longest = max(len(ids) for ids, _, _ in responses)
    T = longest if length is None else length
    if isinstance(T, bool) or not isinstance(T, int) or longest > T:
        raise ValueError(f"length must be an int ≥ the longest response ({longest} tokens), got {length!r}")
    B = len(responses)
    token_ids = torch.full((B, T), pad_id, dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.bool)
    mu_logp = torch.zeros((B, T), dtype=torch.float32)
    top_ids = top_logp = None
    if topk is not None:
        top_ids = torch.arange(topk).expand(B, T, topk).clone()
        top_logp = torch.full((B, T, topk), -math.inf, dtype=torch.float32)
    for b, (ids, logps, candidates) in enumerate(responses):
        n = len(ids)
        token_ids[b, :n] = torch.tensor(ids, dtype=torch.long)
        mask[b, :n] = True
        mu_logp[b, :n] = torch.tensor(logps, dtype=torch.float32)
        if top_ids is not None and top_logp is not None and topk is not None:
            for t in range(n):
                k_ids, k_logp = _top_k(ids[t], logps[t], candidates[t], topk)
                top_ids[b, t] = torch.tensor(k_ids)
                top_logp[b, t] = torch.tensor(k_logp, dtype=torch.float32)
    return EngineTokens(token_ids, mask, mu_logp, top_ids, top_logp)


__all__ = ["VLLM_LOGPROBS_MODES", "EngineTokens", "from_sglang", "from_vllm", "sglang_sampling", "vllm_sampling"]
