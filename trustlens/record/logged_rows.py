"""The rows `TokenRecorder.log_metrics` and `TokenRecorder.log_samples` add to a run's `metrics`
and `samples` tables (docs/run-format.md): their arguments checked (a bad one is a ValueError
naming it) and made into Arrow record batches of the tables' schemas.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from trustlens.core.argument_checks import check_int, check_number
from trustlens.record.args import check_unique
from trustlens.run import table_schema
from trustlens.run.parts import storable_text


def _is_nan(value: object) -> bool:
    return isinstance(value, (float, np.floating)) and math.isnan(value)


def metrics_batch(step: int, metrics: object) -> pa.RecordBatch:
    """The `metrics` rows of `step`, long format: one (step, name, value) row per metric;
    `metrics` maps names to numbers (or one-element tensors), stored as float64."""
    if not isinstance(metrics, Mapping):
        raise ValueError(f"metrics must be a mapping name -> number, got {type(metrics).__name__}")
    names, values = [], []
    for name, value in metrics.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"metric names must be non-empty strings, got {name!r}")
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"metric {name!r} must be a scalar, got a tensor of shape {tuple(value.shape)}")
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
            raise ValueError(f"metric {name!r} must be a number, got {value!r}")
        names.append(storable_text(name))
        values.append(float(value))
    n = len(names)
    return pa.RecordBatch.from_pydict(
        {"step": [step] * n, "name": names, "value": values},
        schema=table_schema("metrics"),
    )


def samples_batch(
    step: int, given: Mapping[str, tuple[str, Any]], first_id: Callable[[int], int]
) -> tuple[pa.RecordBatch, bool]:
    """(the `samples` rows of `step`, whether their sample ids are the default ones).

    given: argument -> (column, its entries or None), one entry per sample, for `log_samples`'s
        arguments. A NaN (or None) reward or advantage is stored as null; ±inf raises. Given
        sample ids must be unique within the call.
    first_id: n -> the first of n consecutive default sample ids, used when no sample ids are
        given; the group ids default to the sample ids."""
    sizes = {}
    for arg, (_, entries) in given.items():
        if entries is None:
            continue
        if isinstance(entries, (str, bytes)) or not hasattr(entries, "__len__"):
            raise ValueError(f"{arg} must be a sequence with one entry per sample, got {type(entries).__name__}")
        sizes[arg] = len(entries)
    if not sizes:
        raise ValueError("log_samples needs at least one of prompts, responses, rewards, advantages, lengths")
    if len(set(sizes.values())) > 1:
        raise ValueError(f"log_samples arguments differ in length: {sizes}")
    n = next(iter(sizes.values()))
    columns: dict[str, Any] = {"step": [step] * n}
    for arg, (name, given_value) in given.items():
        value: Any = given_value.tolist() if isinstance(given_value, (torch.Tensor, np.ndarray)) else given_value
        if name in ("reward", "advantage") and value is not None:
            # NaN or None: no value; anything else a finite number (±inf, text or a list refused)
            value = [None if v is None or _is_nan(v) else check_number(f"{arg}[{i}]", v) for i, v in enumerate(value)]
        if name in ("sample", "group", "length") and value is not None:  # a fractional id or length is refused
            value = [check_int(f"{arg}[{i}]", v, low=0 if name == "length" else None) for i, v in enumerate(value)]
        if name in ("prompt", "response") and value is not None:
            for i, v in enumerate(value):
                if v is not None and not isinstance(v, str):
                    raise TypeError(f"{arg}[{i}] must be a string (or None), got {type(v).__name__} {v!r}")
            value = [None if v is None else storable_text(v) for v in value]
        columns[name] = value
    default_ids = columns["sample"] is None
    if default_ids:
        start = first_id(n)
        columns["sample"] = list(range(start, start + n))
    else:
        check_unique("sample_ids", columns["sample"])
    if columns["group"] is None:
        columns["group"] = columns["sample"]
    try:
        batch = pa.RecordBatch.from_pydict(
            {name: columns.get(name) or [None] * n for name in table_schema("samples").names},
            schema=table_schema("samples"),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as err:
        raise ValueError(f"log_samples: {err}") from err
    return batch, default_ids
