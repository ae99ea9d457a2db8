"""One text format of numbers for every page, tile, table, report and message (no plotly, no
polars: the analyses' alert messages use it too; `trustlens.plots.numbers` adds figures' axes).

- Plain decimals with 3 significant digits, in scientific notation below 1e-3 and from 1e4 on
  (1.6e-4, never 1.6e-04), never SI prefixes: on a page about μ a "μ" reads as the rollout
  policy, not as micro (`decimal`, `signed`).
- Counts shortened with k and M (307k, 1.2M) (`count`).
- Fractions of tokens — block rates, shares — as percentages (2.2 %): `percent`, chosen by the
  column's name (`is_rate`).
- |values| below `NOISE` of their scale (the unit, or the series' largest |value| when that is
  larger) are float rounding — k3 of 1.8e-15 where μ = π_old — and are shown as 0, not as a
  trend (`noise_to_zero`).
"""

from __future__ import annotations

import math

# |value| / scale below this is float rounding, drawn and shown as 0
NOISE = 1e-9


def is_rate(name: str) -> bool:
    """Whether a column called `name` holds a fraction of tokens, shown as a percentage: a block
    rate (blocked_<rule> per step, blocked_frac, block_rate…) or a share (zero_adv_frac,
    only_a_frac, over_frac_neg…)."""
    return name.startswith(("blocked_", "block_rate")) or "_frac" in name


def noise_floor(scale: float = 1.0) -> float:
    """The largest |value| that is float rounding at `scale`: NOISE · max(1, |scale|)."""
    return NOISE * max(1.0, abs(scale))


def noise_to_zero(value: float | None, scale: float = 1.0) -> float | None:
    """0.0 for a |value| below `noise_floor(scale)`, else the value (None and NaN unchanged)."""
    return 0.0 if value is not None and abs(value) < noise_floor(scale) else value


def decimal(value: float | None, digits: int = 3) -> str:
    """`digits` significant digits, in scientific notation below 1e-3 and from 1e4 on (1.6e-4, not
    1.6e-04); 0 as "0"; ±∞ as ∞; None or NaN as "n/a"."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if math.isinf(value):
        return "∞" if value > 0 else "−∞"
    if value == 0 or 1e-3 <= abs(value) < 1e4:
        return f"{value:.{digits}g}"
    mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def signed(value: float | None, digits: int = 3) -> str:
    """`decimal` with its sign always written (+2.3e-6, −0.004, 0)."""
    text = decimal(value, digits)
    return f"+{text}" if value is not None and value > 0 and not math.isinf(value) else text


def count(n: int | None) -> str:
    """A count shortened to 3 significant digits with k (thousands) or M (millions): 307k, 32k,
    1.2M; below 10,000 in full (9,999)."""
    if n is None:
        return "n/a"
    for size, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(n) >= size and (suffix == "M" or abs(n) >= 1e4):
            return f"{n / size:.3g}{suffix}"
    return f"{n:,}"


def percent(fraction: float | None) -> str:
    """A fraction as a percentage with up to 3 significant digits: 2.2 %, 75 %, 0.0213 %."""
    if fraction is None or math.isnan(fraction):
        return "n/a"
    return f"{100 * fraction:.3g} %"


__all__ = ["NOISE", "count", "decimal", "is_rate", "noise_floor", "noise_to_zero", "percent", "signed"]
