"""The sample and group ids of a `TokenRecorder`'s calls: the caller's ids, checked and copied,
and the default numbering of one rank.

Default sample ids number the samples of a key (table, step, ...) on a rank in call order:

    id = step · SAMPLE_STEP + rank · SAMPLE_RANK + index of the sample under the key,

unique across steps and ranks while rank < SAMPLE_STEP / SAMPLE_RANK (1000) and a key holds at
most SAMPLE_RANK (10⁶) samples. An id recorded before under its key (a caller's id given twice
for one step and update, or colliding with a default one) is refused, naming the ids.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from trustlens.record.args import check_unique, id_tensor

SAMPLE_STEP, SAMPLE_RANK = 10**9, 10**6


class SampleIds:
    """The default sample-id counters of one rank, and the check of the ids a caller gives.

    A call numbers its samples in two stages: `first` reserves nothing and may raise, `take`
    counts the ids once the call that uses them has passed its checks, so that a refused call
    leaves no gap."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        # key -> ids taken so far. Counters of every key are kept (a few bytes per step), so that
        # ids stay unique whatever the order of calls across steps.
        self._next: dict[tuple[Any, ...], int] = {}
        # key -> the ids recorded under it: (first, count) ranges of default ids, arrays of the
        # caller's (8 bytes a sample), so that a repeated (step, update, sample) is refused
        self._used: dict[tuple[Any, ...], list[tuple[int, int] | np.ndarray]] = {}

    def check_new(self, name: str, key: tuple[Any, ...], ids: np.ndarray) -> None:
        """Raise a ValueError naming the ids among `ids` (N,) recorded before under `key` =
        (table, step, ...) on this rank: the rows would repeat a (step, update, sample) key.
        Only the ids of samples that write rows count (`live`, see `of_call`)."""
        repeated = np.zeros(len(ids), bool)
        for used in self._used.get(key, ()):
            if isinstance(used, tuple):
                repeated |= (ids >= used[0]) & (ids < used[0] + used[1])
            else:
                repeated |= np.isin(ids, used)
        if repeated.any():
            where = f"step {key[1]}" + (f", update {key[2]}" if len(key) > 2 else "")
            shown = ", ".join(str(int(i)) for i in ids[repeated][:8]) + (" ..." if repeated.sum() > 8 else "")
            once = "(step, update)" if len(key) > 2 else "step"
            raise ValueError(
                f"{name} {shown} were recorded before at {where} on rank {self.rank}; a sample id keys "
                f"its {key[0]} rows and may appear once per {once}: pass ids not used before"
            )

    def note(
        self, key: tuple[Any, ...], ids: torch.Tensor | np.ndarray | int, n: int, live: np.ndarray | None = None
    ) -> None:
        """Count a call's sample ids under `key` as recorded: the caller's ids (N,) of the samples
        that write rows (`live` (N,) bool, None: all), or `n` default ids from `ids` (an int: the
        first), which also advances the default counter."""
        if isinstance(ids, int):
            self._used.setdefault(key, []).append((ids, n))
            self.take(key, n)
        else:
            given = ids.detach().cpu().numpy() if isinstance(ids, torch.Tensor) else ids
            given = given if live is None else given[live]
            self._used.setdefault(key, []).append(np.array(given, np.int64, copy=True))

    def first(self, key: tuple[Any, ...], n: int) -> int:
        """The first of the next `n` default sample ids of `key` = (table, step, ...)."""
        start = self._next.get(key, 0)
        if self.rank * SAMPLE_RANK >= SAMPLE_STEP:
            raise ValueError(f"default sample ids cover ranks < {SAMPLE_STEP // SAMPLE_RANK}: pass sample_ids")
        if start + n > SAMPLE_RANK:
            raise ValueError(f"more than {SAMPLE_RANK} samples at step {key[1]}: pass sample_ids")
        return key[1] * SAMPLE_STEP + self.rank * SAMPLE_RANK + start

    def take(self, key: tuple[Any, ...], n: int) -> None:
        """Count `n` default ids of `key` as used."""
        self._next[key] = self._next.get(key, 0) + n

    def of_call(
        self,
        name: str,
        ids: object,
        batch: int,
        device: torch.device,
        key: tuple[Any, ...] | None,
        live: np.ndarray | None = None,
    ) -> torch.Tensor | int:
        """Per-sample ids (B,) as an int64 tensor on `device`; numbered by default when `key`:
        then the first of the B consecutive ids (the rows' ids are made where they are taken).
        `live` (B,) bool: the samples that write rows (a response with no valid position writes
        none, so its id may repeat one recorded before, as a re-run micro-batch masked out does)."""
        if ids is None:
            assert key is not None, "default ids need a counter key"
            start = self.first(key, batch)
            self.check_new(name, key, np.arange(start, start + batch))
            return start
        if not isinstance(ids, torch.Tensor):
            try:
                ids = torch.as_tensor(ids)
            except (TypeError, ValueError, RuntimeError) as err:
                raise ValueError(f"{name} must be a sequence of {batch} integers: {err}") from None
        # a copy: the rows may be derived after record returns, and the caller may reuse `ids`
        ids = id_tensor(name, ids, (batch,)).to(device=device, dtype=torch.int64, copy=True)
        if name == "sample_ids":
            check_unique(name, ids)
        if key is not None:
            given = ids.cpu().numpy()
            self.check_new(name, key, given if live is None else given[live])
        return ids
