"""Hooks that attach a TokenRecorder to external trainers.

- `trustlens.integrations.trl`: TRL's GRPOTrainer (`TrustLensGRPOTrainer`, `with_trustlens`).
- `trustlens.integrations.verl`: verl 0.7–0.9, by configuration (`external_lib` and a Ray setup hook).
- `trustlens.integrations.openrlhf`: OpenRLHF 0.11, through a Ray setup hook
  (`python -m trustlens.integrations.openrlhf ARGS` runs its `train_ppo_ray` with it).
- `trustlens.integrations.engines`: vLLM's and SGLang's own outputs (`from_vllm`, `from_sglang`)
  as the token ids, mask, log μ and μ's top-K that `TokenRecorder.record` takes.

docs/attach.md says what each records and how it was tested.

A hand-written training loop needs no integration: call `TokenRecorder.record` once per
micro-batch (see examples/plain_loop.py).
"""
