"""The routed experts an engine returns for a mixture-of-experts model, as `record`'s
`mu_routed_experts` (B, T, L, k): for response token t, the experts of every layer at the forward
position that predicted it — the token before it (the prompt's last token for t = 0), whose
logits gave log μ(a_t).

Both engines return the experts of every position they computed (prompt and response, each
token as input) except the last generated token (never fed back), −1 on dense layers:
- vLLM (`--enable-return-routed-experts`): `CompletionOutput.routed_experts`, an int array
  [P + n − 1, L, k] (vllm/outputs.py; vllm/v1/core/sched/scheduler.py `_get_routed_experts`:
  request.num_tokens − 1 rows, by position). Response token t is row P − 1 + t, i.e. the last n rows.
- SGLang (`--enable-return-routed-experts`, request `return_routed_experts`):
  `meta_info["routed_experts"]`, base64 of little-endian int32 of shape [rows, L, k] (or the
  nested lists), covering positions [start, P + n − 1) with start the request's
  `routed_experts_start_len` (0: the whole sequence; python/sglang/srt/managers/io_struct.py).
  Response token t is row P − 1 + t − start; P is meta_info["prompt_tokens"].
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch


def _rows(where: str, experts: np.ndarray, n: int, prompt: int | None, start: int) -> np.ndarray:
    """The n rows of the response's tokens from an engine's [rows, L, k] array covering positions
    [start, P + n − 1); P = `prompt` (None: not known, the rows then end at the response's last
    position)."""
    if experts.ndim != 3 or 0 in experts.shape[1:]:
        raise ValueError(f"{where}: routed experts must be [positions, layers, top_k], got shape {experts.shape}")
    rows = experts.shape[0]
    if prompt is not None and rows != prompt + n - 1 - start:
        raise ValueError(
            f"{where}: routed experts hold {rows} positions; a prompt of {prompt} tokens and {n} output tokens "
            f"from position {start} give {prompt + n - 1 - start} (the last output token is never routed)"
        )
    first = rows - n  # the row of the position before the first output token
    if first < 0:
        raise ValueError(
            f"{where}: routed experts hold {rows} positions from position {start}, fewer than the {n} output "
            "tokens' (routed_experts_start_len must leave the prompt's last position in)"
        )
    return experts[first:]


def vllm_routed(where: str, completion: Any, request: Any, n: int) -> np.ndarray | None:
    """The [n, L, k] experts of a vLLM completion's output tokens (module docstring), None when
    it has none."""
    experts = getattr(completion, "routed_experts", None)
    if experts is None:
        return None
    prompt = getattr(request, "prompt_token_ids", None)
    return _rows(where, _int_array(where, experts), n, None if prompt is None else len(prompt), 0)


def sglang_routed(
    where: str, meta: Mapping[str, Any], n: int, start: int, shape: tuple[int, int] | None
) -> np.ndarray | None:
    """The [n, L, k] experts of an SGLang response's output tokens (module docstring), None when
    meta_info has none. `shape` (L, k) reshapes the base64 form; `start` is the request's
    routed_experts_start_len (meta_info's own wins where a proxy kept it)."""
    payload = meta.get("routed_experts")
    if payload is None:
        return None
    start = int(meta.get("routed_experts_start_len", start))
    prompt = meta.get("prompt_tokens")
    if isinstance(payload, str):
        try:
            flat = np.frombuffer(base64.b64decode(payload, validate=True), dtype="<i4")
        except (binascii.Error, ValueError):
            raise ValueError(f"{where}: meta_info.routed_experts is not base64 of int32 values") from None
        if shape is None:
            raise ValueError(
                f"{where}: meta_info.routed_experts is base64: pass routed_experts_shape=(num_layers, top_k) "
                "to read it (the model config's num_hidden_layers and num_experts_per_tok)"
            )
        if flat.size % (shape[0] * shape[1]):
            raise ValueError(f"{where}: {flat.size} routed expert ids do not fill rows of {shape[0]} × {shape[1]}")
        experts = flat.reshape(-1, *shape)
    else:
        experts = _int_array(where, payload)
        if shape is not None and tuple(experts.shape[1:]) != tuple(shape):
            raise ValueError(f"{where}: routed experts have {experts.shape[1:]} layers × top_k, not {tuple(shape)}")
    return _rows(where, experts, n, prompt if isinstance(prompt, int) else None, start)


def _int_array(where: str, value: Any) -> np.ndarray:
    array = np.asarray(value.cpu() if isinstance(value, torch.Tensor) else value)
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{where}: routed experts must be integer expert ids, got dtype {array.dtype}")
    return array


def routed_tensor(per_response: Sequence[np.ndarray | None], length: int) -> torch.Tensor | None:
    """(B, T, L, k) int64 of every response's [n, L, k] experts, −1 on padding; None when no
    response has any. ValueError when some responses have them and others not, or when their
    layers or top_k differ."""
    given = [r for r in per_response if r is not None]
    if not given:
        return None
    if len(given) != len(per_response):
        missing = next(b for b, r in enumerate(per_response) if r is None)
        raise ValueError(f"response {missing} has no routed experts while others have: ask every request for them")
    shapes = {r.shape[1:] for r in given}
    if len(shapes) > 1:
        raise ValueError(f"the responses' routed experts differ in layers × top_k: {sorted(shapes)}")
    (layers, k) = shapes.pop()
    out = torch.full((len(given), length, layers, k), -1, dtype=torch.long)
    for b, rows in enumerate(given):
        out[b, : len(rows)] = torch.from_numpy(rows.astype(np.int64))
    return out
