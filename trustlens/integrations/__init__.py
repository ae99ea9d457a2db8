"""Hooks that attach a TokenRecorder to external trainers, one package per framework.

- `trustlens.integrations.trl`: TRL's GRPOTrainer (`TrustLensGRPOTrainer`, `with_trustlens`,
  `TrustLensCallback`).
- `trustlens.integrations.verl`: verl 0.7–0.9, by configuration (`external_lib` and a Ray setup hook).
- `trustlens.integrations.openrlhf`: OpenRLHF 0.11, through a Ray setup hook
  (`python -m trustlens.integrations.openrlhf ARGS` runs its `train_ppo_ray` with it).
- `trustlens.integrations.engines`: vLLM's and SGLang's own outputs (`from_vllm`, `from_sglang`)
  as the token ids, mask, log μ and μ's top-K that `TokenRecorder.record` takes.

Each framework's package has the same parts where the framework has them: `compat` (the releases
supported, checked with `check_version`), `rules` (the `ActiveRule` its loss is recorded with),
`sampling` (run.json's `sampling` from its settings), `hook` or `driver` / `workers` (where it is
patched), `stop` (stopping on live alerts). What the Ray trainers' hooks share (verl, OpenRLHF) is
in `_ray_hooks`, private to this package. docs/attach.md says what each records, how it was
tested, and how to add a framework.

A hand-written training loop needs no integration: call `TokenRecorder.record` once per
micro-batch (see examples/plain_loop.py).
"""

from __future__ import annotations

from trustlens.integrations.active_rule import ActiveRule
from trustlens.integrations.versions import check_version

__all__ = ["ActiveRule", "check_version"]
