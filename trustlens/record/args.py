"""The checks of `TokenRecorder`'s arguments that need no pass over the data (types, shapes,
ranges: a bad one is a ValueError naming the argument), and the rank a recorder writes.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from trustlens.core.argument_checks import check_temperature
from trustlens.run.background import BackgroundWriter
from trustlens.run.errors import WriterError


def distributed_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world size): explicit values win; else torch.distributed when it is initialised;
    else the RANK / WORLD_SIZE environment (torchrun sets them before init_process_group);
    else (0, 1)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        found = dist.get_rank(), dist.get_world_size()
    else:
        env = [os.environ.get(k) for k in ("RANK", "WORLD_SIZE")]
        found = (
            int_arg("environment RANK", env_int(env[0]), 0, 2**15) if env[0] else 0,
            int_arg("environment WORLD_SIZE", env_int(env[1]), 1, 2**15) if env[1] else 1,
        )
    rank = found[0] if rank is None else int_arg("rank", rank, 0, 2**15)
    world_size = found[1] if world_size is None else int_arg("world_size", world_size, 1, 2**15)
    if rank >= world_size:
        raise ValueError(f"rank {rank} must be < world_size {world_size}")
    return rank, world_size


def env_int(value: str | None) -> int | str | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return value


def positive_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def config_dict(config: Any) -> dict[str, Any] | None:
    """The run's config as a JSON-able dict: dataclasses and mappings are converted."""
    if config is None:
        return None
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if isinstance(config, Mapping):
        return dict(config)
    raise ValueError(f"config must be a dataclass instance or a mapping, got {type(config).__name__}")


def int_arg(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = int(value)
    if isinstance(value, (bool, float)) or not isinstance(value, (int, np.integer)) or not low <= value < high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}), got {value!r}")
    return int(value)


def id_tensor(name: str, t: object, shape: tuple[int, ...]) -> torch.Tensor:
    """Require an integer tensor of `shape`."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor, got dtype {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {shape}")
    return t


def check_unique(name: str, ids: torch.Tensor | list) -> None:
    """Sample ids must be unique within one call."""
    values = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
    seen: set = set()
    for i, v in enumerate(values):
        if v in seen:
            raise ValueError(f"{name} holds {v!r} twice (again at index {i}); sample ids must be unique")
        seen.add(v)


def check_tensor_shape(name: str, t: object, shape: tuple[int, ...]) -> None:
    """Require a floating-point tensor of `shape`."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {shape} like token_ids")


def check_arguments(
    token_ids: object,
    per_token: dict[str, torch.Tensor | None],
    topk_ids: object,
    topk_logp: object,
    temperature: object,
) -> tuple[int, int]:
    """The checks of `record`'s arguments that need no pass over the data; returns (B, T)."""
    if not isinstance(token_ids, torch.Tensor) or token_ids.dim() != 2:
        got = tuple(token_ids.shape) if isinstance(token_ids, torch.Tensor) else type(token_ids).__name__
        raise ValueError(f"token_ids must be a (B, T) integer tensor, got {got}")
    shape = (token_ids.shape[0], token_ids.shape[1])
    id_tensor("token_ids", token_ids, shape)
    if per_token["mu_logp"] is None and per_token["old_logp"] is None:
        raise ValueError("record needs mu_logp or old_logp: ratio and divergences compare π with one of them")
    if (topk_ids is None) != (topk_logp is None):
        raise ValueError("mu_topk_ids and mu_topk_logp must be given together")
    check_temperature(temperature)
    for name, t in per_token.items():
        if t is not None or name == "pi_logp":
            check_tensor_shape(name, t, shape)
    return shape


def checked_advantages(advantages: object, shape: tuple[int, int]) -> torch.Tensor:
    """Advantages per sequence (B,) or per token (B, T), as a floating-point tensor (values are
    checked with the other inputs)."""
    if isinstance(advantages, torch.Tensor) and tuple(advantages.shape) in (shape, shape[:1]):
        if not advantages.is_floating_point():
            raise ValueError(f"advantages must be a floating-point tensor, got dtype {advantages.dtype}")
        return advantages
    raise ValueError(
        f"advantages has shape {tuple(getattr(advantages, 'shape', ()))}; expected per-sequence "
        f"({shape[0]},) or per-token {shape}"
    )


def check_tokenizer(tokenizer: object) -> None:
    """None, or an object with a callable `decode(list[int]) -> str` (a Hugging Face tokenizer);
    a model name or a path is refused here, not at the first flush."""
    if tokenizer is None:
        return
    if not callable(getattr(tokenizer, "decode", None)):
        hint = " (load it first, e.g. AutoTokenizer.from_pretrained(...))" if isinstance(tokenizer, str) else ""
        raise TypeError(
            f"tokenizer must have a decode(list[int]) -> str method, got {type(tokenizer).__name__} {tokenizer!r}{hint}"
        )


def check_tokenizer_answer(writer: BackgroundWriter, token_id: int, close: Callable[[BaseException], None]) -> None:
    """The first decode of a recorder's tokenizer (`RankWriter.check_tokenizer`), run on a daemon
    thread and awaited at most `writer_timeout` seconds: its TypeError (a tokenizer that gives
    anything but one str per id) is raised here; a tokenizer that does not answer in time ends the
    run through `close(error)` (`failed`; nothing of the call is queued yet) and raises that
    WriterError. The stuck thread is left to end with the process: it blocks no exit."""
    raised: list[BaseException] = []

    def run_check() -> None:
        try:
            writer.writer.check_tokenizer(token_id)
        except BaseException as err:  # raised in the caller's thread below
            raised.append(err)

    thread = threading.Thread(target=run_check, name="trustlens-tokenizer-check", daemon=True)
    thread.start()
    thread.join(writer.writer_timeout)
    if thread.is_alive():
        err = WriterError(
            f"the tokenizer of the trustlens run {str(writer.path)!r} did not decode token id {token_id} "
            f"within writer_timeout={writer.writer_timeout:g} s: is tokenizer.decode hung? The run was closed as failed"
        )
        close(err)
        raise err
    if raised:
        raise raised[0]
