"""Fields of the engines' outputs beside the sampled ids and their log μ, read per response:
SGLang's flat top-logprobs, the sampling masks of both engines, their weight versions.

- Flat top-logprobs (SGLang `return_flat_raw_output_top_logprobs`): meta_info holds
  `output_top_logprobs_shape` [rows, K], `output_top_logprobs_null_prefix` (leading positions
  without candidates), and the values and ids as flat lists (`…_val_flat`, `…_idx_flat`) or, with
  `return_flat_raw_output_top_logprobs_b64`, as base64 of little-endian arrays (`…_val_flat_b64`,
  `…_idx_flat_b64`, dtypes in `…_b64_dtype`, float32 and int32 by default). Position i ≥ null
  prefix holds entries (i − null_prefix)·K … +K of the flat arrays; `rows` counts the positions
  with or without the null prefix, depending on SGLang's version: both are read.
- Sampling masks: per generated token the ids it was drawn from (vLLM
  `CompletionOutput.sampling_mask.token_ids` with `return_sampling_mask`; SGLang
  `meta_info.output_token_sampling_mask`). The sampled id must be among them.
- Weight versions: the version of the weights that sampled each token. SGLang: meta_info
  `weight_versions`, spans {"version", "start", "end"} over the output tokens, else the
  response's single `weight_version`; vLLM: `CompletionOutput.weight_versions` read the same way
  (spans, one version per token, or one for the response), else its RequestOutput's
  `weight_version` (bound to the request). Versions are labels: an integer, or a label ending
  in one ("step-42", "v3") reads as that integer; any other ("default" before the first weight
  update of either engine) is not known: −1.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trustlens.integrations.engines.tokens import log_prob, token_id

_FLAT = "output_top_logprobs"


def has_flat_top(meta: Mapping[str, Any]) -> bool:
    """Whether `meta` carries SGLang's flat output top-logprobs."""
    return f"{_FLAT}_shape" in meta


def flat_top(where: str, meta: Mapping[str, Any], n: int) -> list[list[tuple[int, float]]]:
    """Per output position the (id, log μ) candidates of SGLang's flat top-logprobs (module
    docstring), [] at the null prefix; ValueError naming `where` when they do not fit n positions."""
    shape = meta.get(f"{_FLAT}_shape")
    prefix = meta.get(f"{_FLAT}_null_prefix") or 0
    if not isinstance(shape, Sequence) or len(shape) != 2 or not all(isinstance(s, int) for s in shape):
        raise ValueError(f"{where}: {_FLAT}_shape must be [rows, K], got {shape!r}")
    values = _flat_array(where, meta, "val", "float32")
    ids = _flat_array(where, meta, "idx", "int32")
    k = shape[1]
    if values.size != ids.size or (k and values.size % k) or (not k and values.size):
        raise ValueError(f"{where}: {values.size} flat values and {ids.size} ids do not fill rows of K = {k}")
    covered = values.size // k if k else shape[0]
    if shape[0] not in (covered, covered + prefix) or covered + prefix != n:
        raise ValueError(
            f"{where}: flat top-logprobs of shape {list(shape)} with null prefix {prefix} do not cover the "
            f"{n} output tokens"
        )
    rows: list[list[tuple[int, float]]] = [[] for _ in range(prefix)]
    for r in range(covered):
        row = [
            (token_id(f"{where}, position {prefix + r}", int(i)), log_prob(f"{where}, position {prefix + r}", float(v)))
            for i, v in zip(ids[r * k : (r + 1) * k], values[r * k : (r + 1) * k], strict=True)
        ]
        rows.append(row)
    return rows


def _flat_array(where: str, meta: Mapping[str, Any], part: str, dtype: str) -> np.ndarray:
    plain, encoded = meta.get(f"{_FLAT}_{part}_flat"), meta.get(f"{_FLAT}_{part}_flat_b64")
    if encoded is not None:
        kind = meta.get(f"{_FLAT}_{part}_flat_b64_dtype") or dtype
        if kind not in ("float32", "float64", "int32", "int64"):
            raise ValueError(f"{where}: {_FLAT}_{part}_flat_b64_dtype must be float32/64 or int32/64, got {kind!r}")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, TypeError, ValueError) as err:
            raise ValueError(f"{where}: {_FLAT}_{part}_flat_b64 is not base64: {err}") from err
        item = np.dtype(kind).newbyteorder("<")
        if len(raw) % item.itemsize:
            raise ValueError(f"{where}: {_FLAT}_{part}_flat_b64 holds {len(raw)} bytes, not whole {kind} values")
        return np.frombuffer(raw, dtype=item)
    if plain is None:
        raise ValueError(f"{where}: flat top-logprobs without {_FLAT}_{part}_flat or {_FLAT}_{part}_flat_b64")
    return np.asarray(plain, dtype=np.float64 if part == "val" else np.int64)


def supports(where: str, masks: Any, ids: list[int]) -> list[list[int]] | None:
    """Per token the ids of its sampling support (`masks`: per token a list of ids, or an object
    with such a `token_ids`); None without masks. ValueError naming `where` when a mask lacks its
    sampled id or the count differs."""
    if masks is None:
        return None
    masks = getattr(masks, "token_ids", masks)
    if len(masks) != len(ids):
        raise ValueError(f"{where}: a sampling mask for {len(masks)} tokens, but {len(ids)} tokens")
    out = []
    for t, (token, support) in enumerate(zip(ids, masks, strict=True)):
        support = [token_id(f"{where}, position {t}, sampling mask", int(i)) for i in support]
        if token not in support:
            raise ValueError(f"{where}, position {t}: the sampling mask lacks the sampled token {token}")
        out.append(support)
    return out


def sampling_logprobs(where: str, values: Any, masks: Any, ids: list[int]) -> list[float]:
    """Per token the processed log μ of SGLang's `output_token_sampling_logprobs`: one number per
    token (sampling_logprobs_mode "selected"), or per token a list aligned with the token's
    sampling mask (the support's log-probs), of which the sampled id's."""
    if values is None or len(values) != len(ids):
        n = "none" if values is None else len(values)
        raise ValueError(
            f"{where}: meta_info.output_token_sampling_logprobs has {n} entries for {len(ids)} tokens: "
            "call /generate with return_sampling_mask=true"
        )
    out = []
    for t, (token, value) in enumerate(zip(ids, values, strict=True)):
        if isinstance(value, Sequence):
            support = list(getattr(masks, "token_ids", masks or [])[t]) if masks is not None else []
            if token not in support or len(support) != len(value):
                raise ValueError(f"{where}, position {t}: support log-probs without a sampling mask that holds {token}")
            value = value[support.index(token)]
        out.append(log_prob(f"{where}, position {t}", value))
    return out


def weight_versions(where: str, versions: Any, n: int) -> list[int] | None:
    """Per token the weight version (module docstring), −1 where not known; None without any."""
    if versions is None:
        return None
    if isinstance(versions, (int, str)):
        return [_version(versions)] * n
    versions = list(versions)
    if all(isinstance(v, (int, str)) for v in versions):
        if len(versions) != n:
            raise ValueError(f"{where}: {len(versions)} weight versions for {n} tokens")
        return [_version(v) for v in versions]
    out = [-1] * n
    for span in versions:
        get = span.get if isinstance(span, Mapping) else lambda key, s=span: getattr(s, key, None)
        start, end = get("start"), get("end")
        if not isinstance(start, int) or not isinstance(end, int) or not 0 <= start <= end <= n:
            raise ValueError(f"{where}: weight version span {span!r} is not within the {n} output tokens")
        out[start:end] = [_version(get("version"))] * (end - start)
    return out


def _version(value: Any) -> int:
    """A weight version as an int: an int ≥ 0, or the number a label ends with ("17", "step-42",
    "v3"); −1 (not known) for anything else ("default", "initial")."""
    if isinstance(value, bool):
        return -1
    if isinstance(value, int):
        return value if value >= 0 else -1
    found = re.fullmatch(r"\D*?(\d+)", value.strip()) if isinstance(value, str) else None
    return int(found.group(1)) if found else -1


__all__ = ["flat_top", "has_flat_top", "sampling_logprobs", "supports", "weight_versions"]
