"""The argument checks shared by the divergence functions: a logits tensor (..., V), a tensor of the
logits' leading shape, and the float dtype of a result (the temperature: core.argument_checks)."""

from __future__ import annotations

from trustlens.core.tensor_checks import check_tensor
from trustlens.core.torch_import import torch


def check_logits(name: str, logits: object) -> torch.Tensor:
    """Require a floating-point (..., V) tensor with V ≥ 1; NaN/inf are caught chunk by chunk."""
    logits = check_tensor(name, logits, finite=False)
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"{name} must have shape (..., V) with V ≥ 1, got {tuple(logits.shape)}")
    return logits


def check_lead(name: str, t: torch.Tensor, logits_name: str, logits: torch.Tensor, extra: int) -> None:
    """Require t to have logits' leading dims followed by `extra` (0 or 1) dims of its own."""
    lead = tuple(logits.shape[:-1])
    if t.dim() != len(lead) + extra or tuple(t.shape[: len(lead)]) != lead:
        expected = f"{lead}" if extra == 0 else f"{(*lead, 'K')}"
        raise ValueError(
            f"{name} has shape {tuple(t.shape)}; expected {expected} to match {logits_name} of "
            f"shape {tuple(logits.shape)}"
        )


def result_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 when any input is float64, else float32."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def lead_index(logits: torch.Tensor, row: int) -> tuple[int, ...]:
    """The index in logits' leading dims of flat row `row`."""
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(row), logits.shape[:-1]))


__all__ = ["check_lead", "check_logits", "lead_index", "result_dtype"]
