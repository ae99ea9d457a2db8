"""The rollout engines' own outputs as what `TokenRecorder.record` takes: vLLM's and SGLang's.

    from trustlens.integrations.engines import from_vllm, vllm_sampling
    outputs = llm.generate(prompts, SamplingParams(temperature=0.7, logprobs=20))
    mu = from_vllm(outputs, topk=20)
    recorder = TokenRecorder(path, sampling=vllm_sampling(params, "processed_logprobs"))
    recorder.record(step, **mu.record_args(), pi_logp=..., advantages=...)

- `from_vllm(outputs)`: vLLM's `RequestOutput`s (every one of their `.outputs`, in order) or
  `CompletionOutput`s. Per response it reads `token_ids` and `logprobs`, a list with one
  {token_id: Logprob(logprob, rank, decoded_token)} per generated token (vllm/logprobs.py:
  `SampleLogprobs`; the `FlatLogprobs` container of recent versions reads the same). vLLM always
  puts the sampled token in that position's dict, beside the `SamplingParams(logprobs=K)` most
  likely ones; a dict without it means the outputs and the ids do not belong together, and is a
  ValueError naming the response and the position. With `SamplingParams(logprob_token_ids=[…])`
  the dict holds the ids the user chose, ranked by their place in that list, not μ's top-K: pass
  `params=` and `topk` is refused; without `params`, ranks out of the order of the log-probs are
  refused. The engine's `logprobs_mode` "raw_logits" / "processed_logits" returns logits: refused.
  Also read where present: `sampling_mask` (`return_sampling_mask`) and the weight versions
  (`weight_versions` or `weight_version` of the CompletionOutput, else of its RequestOutput).
- `from_sglang(responses)`: SGLang `/generate` JSON (`return_logprob=True`, `top_logprobs_num=K`),
  one dict per response (or one dict): `meta_info.output_token_logprobs` is a list of
  [logprob, token_id, text] per generated token (text is null unless `return_text_in_logprobs`),
  `meta_info.output_top_logprobs` per token a list of such triples, most likely first, or the
  flat arrays of `return_flat_raw_output_top_logprobs` (plain or base64). `processed=True` reads
  log μ from `output_token_sampling_logprobs` (`return_sampling_mask`). Also read where present:
  `output_token_sampling_mask`, `weight_versions` / `weight_version`.
- Routed experts of a mixture-of-experts model (both engines' `--enable-return-routed-experts`):
  vLLM's `CompletionOutput.routed_experts`, SGLang's `meta_info["routed_experts"]` (base64 with
  `routed_experts_shape=(layers, top_k)`, and the request's `routed_experts_start_len`), as
  `mu_routed_experts` (B, T, L, k): the experts of the position that predicted each output token
  (`routing`).

Both return `EngineTokens` (this package's `tokens`: shapes and pad values; the sampling masks'
support sizes and the weight versions are in it; `fields`: how they are read). The log-probs are
the engine's, of the kind its settings made them (raw, tempered or processed: `sampling`);
`vllm_sampling` and `sglang_sampling` give TokenRecorder's `sampling` from the engines' settings.
The code: `vllm` (`from_vllm`), `sglang` (`from_sglang`), `tokens`, `fields`, `routing` and `sampling`.
"""

from __future__ import annotations

from trustlens.integrations.engines.sampling import VLLM_LOGPROBS_MODES, sglang_sampling, vllm_sampling
from trustlens.integrations.engines.sglang import from_sglang
from trustlens.integrations.engines.tokens import EngineTokens
from trustlens.integrations.engines.vllm import from_vllm

__all__ = [
    "VLLM_LOGPROBS_MODES",
    "EngineTokens",
    "from_sglang",
    "from_vllm",
    "sglang_sampling",
    "vllm_sampling",
]
