"""Metrics of the built-in trainer reduced over data-parallel ranks, logged once from rank 0.

A rate or a mean over tokens is exact over ranks only when pooled: Σ numerator / Σ denominator
over every rank's tokens, not the mean of the ranks' own rates (ranks hold different numbers of
tokens of each advantage sign: docs/metrics.md, "Under data parallelism"). A `Pooled` metric
carries one rank's sums and how to finish the totals into the value; `log_reduced` adds the sums
over ranks in one all-reduce and logs the values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from trustlens.train.world import World, all_reduce_


@dataclass(frozen=True)
class Pooled:
    """A metric that is exact over ranks only when pooled: each rank's `sums` are added over the
    ranks and `finish` turns the totals into the value. A token mean is Σ values / Σ tokens over
    all ranks, not the mean of the ranks' means (ranks hold different numbers of tokens, of each
    advantage sign); `log_reduced` reduces it so. `value` is this rank's own."""

    sums: tuple[float, ...]
    finish: Callable[[list[float]], float]

    @property
    def value(self) -> float:
        return self.finish(list(self.sums))


def _divide(sums: list[float]) -> float:
    num, den = sums
    return num / den if den else math.nan


def mean_of_ratios(sums: list[float]) -> float:
    """(k_0, n_0, k_1, n_1, ...) -> the mean of k_i / n_i over the pairs with n_i > 0, NaN if none."""
    rates = [k / n for k, n in zip(sums[::2], sums[1::2], strict=True) if n]
    return sum(rates) / len(rates) if rates else math.nan


def std(sums: list[float]) -> float:
    """(n, Σx, Σx²) -> the unbiased standard deviation of the n values (0 for fewer than two)."""
    n, s1, s2 = sums
    return math.sqrt(max(s2 - s1 * s1 / n, 0.0) / (n - 1)) if n > 1 else 0.0


def _mean_minus_one(sums: list[float]) -> float:
    """(Σx, n) -> Σx/n − 1, NaN when n = 0 (a χ² from the mean of squared ratios)."""
    return _divide(sums) - 1


def _pearson(sums: list[float]) -> float:
    """(n, Σx, Σy, Σx², Σy², Σxy) -> the Pearson correlation of the n pairs (population moments,
    clipped to [−1, 1]); NaN for fewer than two pairs or a constant x or y."""
    n, sx, sy, sxx, syy, sxy = sums
    if n < 2:
        return math.nan
    var_x, var_y = sxx / n - (sx / n) ** 2, syy / n - (sy / n) ** 2
    if var_x <= 0 or var_y <= 0:
        return math.nan
    return min(1.0, max(-1.0, (sxy / n - sx * sy / n**2) / math.sqrt(var_x * var_y)))


def pooled_chi2(squares: torch.Tensor, mask: torch.Tensor) -> Pooled:
    """Mean of `squares` over mask minus 1, over all ranks (χ² = E[ρ²] − 1)."""
    return Pooled(masked_mean(squares, mask).sums, _mean_minus_one)


def pooled_pearson(x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> Pooled:
    """The Pearson correlation of x and y over mask, over all ranks' pairs (from pooled moments)."""
    a, b = x[mask].double(), y[mask].double()
    sums = (len(a), a.sum(), b.sum(), (a * a).sum(), (b * b).sum(), (a * b).sum())
    return Pooled(tuple(float(v) for v in sums), _pearson)


def ratio(num: float, den: float) -> Pooled:
    """Σ num / Σ den over ranks; NaN when Σ den = 0 (e.g. a block rate of a sign no rank saw)."""
    return Pooled((float(num), float(den)), _divide)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> Pooled:
    """Mean of x over mask (True entries), over all ranks' tokens; NaN when every mask is empty.
    Summed in float64; a +inf entry makes it +inf."""
    return ratio(float(x[mask].double().sum()), int(mask.sum()))


def masked_max(x: torch.Tensor, mask: torch.Tensor) -> float:
    """Max of x over mask, NaN when the mask is empty: a plain value, which `log_reduced` takes
    the maximum of over ranks (name it `*_max`)."""
    return float(x[mask].max()) if bool(mask.any()) else math.nan


def local_values(metrics: Mapping[str, float | Pooled]) -> dict[str, float]:
    """This rank's own values of `metrics` (what `log_reduced` logs in a single process)."""
    return {n: m.value if isinstance(m, Pooled) else m for n, m in metrics.items()}


def log_reduced(recorder, world: World, step: int, metrics: Mapping[str, float | Pooled]) -> dict[str, float]:
    """Reduce the metrics over ranks and log them once, from rank 0 (docs/metrics.md, "Under
    data parallelism"). Every rank passes the same names, and the same number of sums per
    `Pooled` metric.

    A `Pooled` metric (the block rates, the token means, the reward mean and std, ...) is exact
    over ranks: its sums are added over ranks, then finished. A float is a per-rank value:
    `*_max` metrics take the maximum over ranks, the others the mean over ranks (the wall times;
    the held-out accuracy and the gradient norm are the same on every rank). A NaN float counts
    as no value on that rank; ±inf is a value and stays one (a +inf KL is logged as +inf).
    """
    if not metrics:
        return {}
    names = sorted(metrics)
    pooled = {n: m for n in names if isinstance(m := metrics[n], Pooled)}
    plain = {n: m for n in names if not isinstance(m := metrics[n], Pooled)}
    values = torch.tensor(list(plain.values()), dtype=torch.float64)
    present = ~values.isnan()
    sums = [torch.tensor(p.sums, dtype=torch.float64) for p in pooled.values()]
    totals = all_reduce_(torch.cat([torch.where(present, values, 0.0), present.double(), *sums]), "sum").tolist()
    maxes = all_reduce_(torch.where(present, values, -math.inf), "max").tolist()
    reduced: dict[str, float] = {}
    for i, n in enumerate(plain):
        count = totals[len(plain) + i]
        reduced[n] = math.nan if not count else maxes[i] if n.endswith("_max") else totals[i] / count
    offset = 2 * len(plain)
    for n, p in pooled.items():
        reduced[n] = p.finish(totals[offset : offset + len(p.sums)])
        offset += len(p.sums)
    reduced = {n: reduced[n] for n in names}
    if world.main:
        recorder.log_metrics(step, reduced)
    return reduced


__all__ = [
    "Pooled",
    "local_values",
    "log_reduced",
    "masked_max",
    "masked_mean",
    "mean_of_ratios",
    "pooled_chi2",
    "pooled_pearson",
    "ratio",
    "std",
]
