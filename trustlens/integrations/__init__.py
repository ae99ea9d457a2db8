"""Hooks that attach a TokenRecorder to external trainers.

- `trustlens.integrations.trl`: TRL's GRPOTrainer (`TrustLensGRPOTrainer`, `with_trustlens`).

A hand-written training loop needs no integration: call `TokenRecorder.record` once per
micro-batch (see examples/plain_loop.py).
"""
