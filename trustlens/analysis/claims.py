"""The DPPO paper's six claims, measured on a set of recorded runs (several rules × seeds).

Each `Claim` carries a verdict — "holds", "does not hold at this scale" or "untestable" — with
the numbers behind it (mean ± standard error over seeds, `trustlens.analysis.seeds`) and a
plotly figure. The tests, on runs named by their active rule:

    C1  PPO's blocked tokens are low-μ: in the ppo runs, ppo's block rate among A ≠ 0 tokens
        with μ < 0.1 against μ ≥ 0.1, and dppo_binary_tv's on the same tokens. Holds when ppo's
        low-μ rate is at least twice its high-μ rate and above dppo_binary_tv's low-μ rate by
        more than two standard errors.
    C2  DPPO learns at least as fast as PPO: per seed, dppo_binary_tv − ppo in the mean held-out
        accuracy over the evaluations (the area under the curve). Holds unless the mean
        difference is below −2 SE.
    C3  Without a trust region the mismatch grows, then the run collapses, while DPPO stays
        flat: pg_is and cispo collapse on every seed with k3 growing (k3_end > k3_start), and
        dppo_binary_tv collapses on none and ends within noise of its best (`within_noise` of
        trustlens.analysis.seeds) on as many seeds as runs whose accuracy never changes would:
        even those end outside noise with probability 5% each, so the claim fails only when so
        many seeds end outside that the chance of that is below 5% (`noise_tail`; a run without
        eval_size counts as outside).
    C4  A trust region anchored on the recomputed π_old (dppo_binary_tv_recompute, MiniRL's
        anchor) is worse than one anchored on μ: it collapses on more seeds, or ends lower by
        more than 2 SE.
    C5  Binary ≈ Top-K: |dppo_binary_tv − dppo_topk_tv| in final accuracy within 2 SE (or
        0.05), with the share of their blocked tokens they agree on (Jaccard, on the same
        tokens of the dppo_binary_tv runs) reported.
    C6  Collapse is driven by negative-advantage updates: in the collapsing runs without a
        trust region (pg_is, cispo), up to the collapse, the rate of over-updates (tokens
        dppo_binary_tv would block) among A < 0 tokens against A > 0 tokens. Holds when the
        A < 0 rate exceeds the A > 0 rate by more than 2 SE of the per-run difference.

A claim whose runs are missing, or (C2, C4–C6) that has fewer than two paired seeds to judge the
noise by, is "untestable".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from trustlens.analysis.buckets import anchor_column, collect, nonzero_advantage, weighted, weighted_mean
from trustlens.analysis.claims_text import alert_leads, outcome_rows
from trustlens.analysis.mismatch import mismatch_per_step
from trustlens.analysis.paper_findings import over_updates_per_step
from trustlens.analysis.seeds import (
    LOW_MU,
    accuracy_per_step,
    check_distinct_seeds,
    mean_se,
    noise_tail,
    over_seeds,
    run_outcome,
)
from trustlens.analysis.summary import exact_aggregates
from trustlens.run import blocked_column

HOLDS, FAILS, UNTESTABLE = "holds", "does not hold at this scale", "untestable"


@dataclass
class Claim:
    """One measured claim."""

    key: str  # C1 … C6
    title: str  # the claim in a few words
    verdict: str  # HOLDS, FAILS or UNTESTABLE
    evidence: str  # one line of numbers behind the verdict
    figure: Any = field(default=None, repr=False)  # a plotly Figure, None when untestable

    def line(self) -> str:
        return f"{self.key} {self.title}: {self.verdict} — {self.evidence}"


def _paired(a: dict[int, Any], b: dict[int, Any]) -> list[float]:
    return [a[s] - b[s] for s in sorted(set(a) & set(b)) if a[s] is not None and b[s] is not None]


def evidence_of_one(diff: list[float]) -> str:
    """The single paired difference there is, for an untestable verdict."""
    return f"the one difference measured is {diff[0]:.3g}" if diff else "no paired runs"


def _bar(title: str, names: list[str], values: list[list[float | None]], ytitle: str):
    import plotly.graph_objects as go

    means = [mean_se(v) for v in values]
    fig = go.Figure(
        go.Bar(
            x=names,
            y=[m[0] for m in means],
            error_y=dict(type="data", array=[m[1] or 0.0 for m in means]),
        )
    )
    fig.update_layout(title=title, yaxis_title=ytitle, height=360, width=640)
    return fig


def _curves(title: str, series: dict[str, list[list[tuple[int, float]]]], ytitle: str):
    """Mean ± SE over runs of per-step series, one line per rule."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, runs in series.items():
        steps = sorted({s for run in runs for s, _ in run})
        by = [dict(run) for run in runs]
        stats = [mean_se([r.get(s) for r in by]) for s in steps]
        fig.add_trace(
            go.Scatter(
                x=steps,
                y=[m for m, _, _ in stats],
                error_y=dict(type="data", array=[se or 0.0 for _, se, _ in stats]),
                name=name,
                mode="lines+markers",
            )
        )
    fig.update_layout(title=title, yaxis_title=ytitle, xaxis_title="step", height=360, width=640)
    return fig


def _low_high_rates(run, rule: str) -> tuple[float | None, float | None]:
    tokens = run.tokens
    if blocked_column(rule) not in tokens.collect_schema().names():
        return None, None
    low = pl.col(anchor_column(tokens)).cast(pl.Float64) < math.log(LOW_MU)
    col, w = pl.col(blocked_column(rule)), weighted(tokens)
    row = collect(
        tokens.select(
            weighted_mean(col, nonzero_advantage() & low, weights=w).alias("low"),
            weighted_mean(col, nonzero_advantage() & ~low, weights=w).alias("high"),
        )
    ).row(0)
    return row[0], row[1]


class _Runs:
    """Runs grouped by active rule, with their outcomes, keyed by seed (a rule and seed twice is
    refused: `check_distinct_seeds`)."""

    def __init__(self, runs, outcomes: pl.DataFrame | None = None) -> None:
        self.by_rule: dict[str, dict[int, object]] = {}
        self.outcome: dict[str, dict[int, dict]] = {}
        given = list(outcomes.iter_rows(named=True)) if outcomes is not None else [run_outcome(run) for run in runs]
        check_distinct_seeds((out["run"], out["rule"], out["seed"]) for out in given)
        for run, out in zip(runs, given, strict=True):
            rule, seed = out["rule"], out["seed"]
            self.by_rule.setdefault(rule, {})[seed] = run
            self.outcome.setdefault(rule, {})[seed] = out

    def has(self, *rules: str) -> bool:
        return all(r in self.by_rule for r in rules)

    def stat(self, rule: str, name: str) -> dict[int, float]:
        return {s: o[name] for s, o in self.outcome.get(rule, {}).items()}


def _c1(r: _Runs) -> Claim:
    title = "PPO's blocked tokens are low-μ"
    if not r.has("ppo"):
        return Claim("C1", title, UNTESTABLE, "no ppo runs")
    ppo = [_low_high_rates(run, "ppo") for run in r.by_rule["ppo"].values()]
    dppo = [_low_high_rates(run, "dppo_binary_tv") for run in r.by_rule["ppo"].values()]
    lo, hi = [p[0] for p in ppo], [p[1] for p in ppo]
    dlo = [d[0] for d in dppo]
    m_lo, _, _ = mean_se(lo)
    m_hi, _, _ = mean_se(hi)
    diff = [a - b for a, b in zip(lo, dlo, strict=True) if a is not None and b is not None]
    m_d, se_d, _ = mean_se(diff)
    ok = m_lo is not None and m_hi is not None and m_lo >= 2 * m_hi and m_d is not None and m_d > 2 * (se_d or 0)
    evidence = (
        f"ppo blocks {over_seeds(lo)} of A ≠ 0 tokens with μ < {LOW_MU} vs {over_seeds(hi)} with μ ≥ {LOW_MU}; "
        f"dppo_binary_tv blocks {over_seeds(dlo)} of the same low-μ tokens"
    )
    fig = _bar(
        "C1: block rate by μ (ppo runs, A ≠ 0 tokens)",
        [f"ppo μ<{LOW_MU}", f"ppo μ≥{LOW_MU}", f"dppo_binary_tv μ<{LOW_MU}", f"dppo_binary_tv μ≥{LOW_MU}"],
        [lo, hi, dlo, [d[1] for d in dppo]],
        "block rate",
    )
    return Claim("C1", title, HOLDS if ok else FAILS, evidence, fig)


def _auc(run) -> float | None:
    acc = accuracy_per_step(run)
    return math.fsum(a for _, a in acc) / len(acc) if acc else None


def _accuracy_figure(r: _Runs, rules: list[str], title: str):
    return _curves(
        title, {rule: [accuracy_per_step(x) for x in r.by_rule[rule].values()] for rule in rules}, "held-out accuracy"
    )


def _c2(r: _Runs) -> Claim:
    title = "DPPO learns at least as fast as PPO"
    if not r.has("ppo", "dppo_binary_tv"):
        return Claim("C2", title, UNTESTABLE, "needs ppo and dppo_binary_tv runs")
    auc = {rule: {s: _auc(x) for s, x in r.by_rule[rule].items()} for rule in ("ppo", "dppo_binary_tv")}
    diff = _paired(auc["dppo_binary_tv"], auc["ppo"])
    fin = _paired(r.stat("dppo_binary_tv", "acc_final"), r.stat("ppo", "acc_final"))
    m, se, n = mean_se(diff)
    if n < 2:
        return Claim("C2", title, UNTESTABLE, f"needs ≥ 2 seeds of each; {evidence_of_one(diff)}")
    ok = m is not None and m >= -2 * (se or 0)
    evidence = (
        f"dppo_binary_tv − ppo, paired by seed: mean accuracy over evaluations {over_seeds(diff)}, "
        f"final accuracy {over_seeds(fin)}"
    )
    fig = _accuracy_figure(r, ["ppo", "dppo_binary_tv"], "C2: held-out accuracy (mean ± SE over seeds)")
    return Claim("C2", title, HOLDS if ok else FAILS, evidence, fig)


def _k3_series(run) -> list[tuple[int, float]]:
    mm = mismatch_per_step(run.tokens, aggregates=exact_aggregates(run))  # exact for a sampled run too
    return list(zip(mm["step"].to_list(), mm["k3_kl"].to_list(), strict=True))


def _collapsed(r: _Runs, rule: str) -> tuple[int, int]:
    col = r.stat(rule, "collapse_step")
    return sum(v is not None for v in col.values()), len(col)


def _c3(r: _Runs) -> Claim:
    title = "no trust region: mismatch grows, then collapse; DPPO stays stable"
    free = [x for x in ("pg_is", "cispo") if r.has(x)]
    if not free or not r.has("dppo_binary_tv"):
        return Claim("C3", title, UNTESTABLE, "needs pg_is or cispo runs and dppo_binary_tv runs")
    parts, ok = [], True
    for rule in [*free, "dppo_binary_tv"]:
        k, n = _collapsed(r, rule)
        growth = [
            e / s if s and e is not None else None
            for s, e in zip(r.stat(rule, "k3_start").values(), r.stat(rule, "k3_end").values(), strict=True)
        ]
        parts.append(f"{rule} collapsed {k}/{n}, k3 end/start {over_seeds(growth)}")
        if rule == "dppo_binary_tv":
            outside = sum(v is not True for v in r.stat(rule, "within_noise").values())
            drops = r.stat(rule, "acc_drop").values()
            chance = noise_tail(outside, n)
            parts.append(
                f"dppo_binary_tv ended within noise of its best on {n - outside}/{n}, as runs whose "
                f"accuracy never changes would with probability {chance:.2g} "
                f"(best − final accuracy level {over_seeds(list(drops))})"
            )
            ok &= k == 0 and chance >= 0.05
        else:
            ok &= k == n and all(g is not None and g > 1 for g in growth)
    fig = _curves(
        "C3: k3 mismatch per step (mean ± SE over seeds)",
        {rule: [_k3_series(x) for x in r.by_rule[rule].values()] for rule in [*free, "dppo_binary_tv"]},
        "k3_kl (nats)",
    )
    return Claim("C3", title, HOLDS if ok else FAILS, "; ".join(parts), fig)


def _c4(r: _Runs) -> Claim:
    title = "a trust region anchored on the recomputed π_old (MiniRL) is worse than μ-anchored"
    rec = "dppo_binary_tv_recompute"
    if not r.has(rec, "dppo_binary_tv"):
        return Claim("C4", title, UNTESTABLE, f"needs {rec} and dppo_binary_tv runs")
    k_rec, n_rec = _collapsed(r, rec)
    k_mu, n_mu = _collapsed(r, "dppo_binary_tv")
    diff = _paired(r.stat(rec, "acc_final"), r.stat("dppo_binary_tv", "acc_final"))
    m, se, n = mean_se(diff)
    if n < 2:
        return Claim("C4", title, UNTESTABLE, f"needs ≥ 2 seeds of each; {evidence_of_one(diff)}")
    ok = k_rec > k_mu or (m is not None and m < -2 * (se or 0))
    evidence = (
        f"collapsed {k_rec}/{n_rec} (π_old-anchored) vs {k_mu}/{n_mu} (μ-anchored); "
        f"final accuracy π_old − μ anchored {over_seeds(diff)}"
    )
    fig = _accuracy_figure(r, ["dppo_binary_tv", rec], "C4: held-out accuracy, μ vs π_old anchor")
    return Claim("C4", title, HOLDS if ok else FAILS, evidence, fig)


def _jaccard(run, a: str, b: str) -> float | None:
    ca, cb = pl.col(blocked_column(a)), pl.col(blocked_column(b))
    row = collect(
        run.tokens.filter(nonzero_advantage() & ca.is_not_null() & cb.is_not_null()).select(
            (ca & cb).sum().alias("both"), (ca | cb).sum().alias("either")
        )
    ).row(0)
    return row[0] / row[1] if row[1] else None


def _c5(r: _Runs) -> Claim:
    title = "Binary ≈ Top-K"
    if not r.has("dppo_binary_tv", "dppo_topk_tv"):
        return Claim("C5", title, UNTESTABLE, "needs dppo_binary_tv and dppo_topk_tv runs")
    diff = _paired(r.stat("dppo_binary_tv", "acc_final"), r.stat("dppo_topk_tv", "acc_final"))
    jac = [_jaccard(x, "dppo_binary_tv", "dppo_topk_tv") for x in r.by_rule["dppo_binary_tv"].values()]
    m, se, n = mean_se(diff)
    if n < 2:
        return Claim("C5", title, UNTESTABLE, f"needs ≥ 2 seeds of each; {evidence_of_one(diff)}")
    ok = m is not None and abs(m) <= max(2 * (se or 0), 0.05)
    evidence = f"final accuracy binary − top-K {over_seeds(diff)}; blocked-token agreement (Jaccard) {over_seeds(jac)}"
    fig = _accuracy_figure(r, ["dppo_binary_tv", "dppo_topk_tv"], "C5: held-out accuracy, Binary vs Top-K TV")
    return Claim("C5", title, HOLDS if ok else FAILS, evidence, fig)


def _over_rates(run, until: int | None) -> tuple[float | None, float | None]:
    df = over_updates_per_step(run.tokens, "dppo_binary_tv")
    if until is not None:
        df = df.filter(pl.col("step") <= until)
    rates: list[float | None] = []
    for side in ("pos", "neg"):
        n = int(df[f"count_{side}"].sum())
        rates.append(int(df[f"over_{side}"].sum()) / n if n else None)
    return rates[0], rates[1]


def _c6(r: _Runs) -> Claim:
    title = "collapse is driven by negative-advantage updates"
    runs = [
        (r.by_rule[rule][s], o["collapse_step"])
        for rule in ("pg_is", "cispo")
        for s, o in r.outcome.get(rule, {}).items()
        if o["collapse_step"] is not None
    ]
    if not runs:
        return Claim("C6", title, UNTESTABLE, "no collapsing pg_is or cispo run")
    rates = [_over_rates(run, until) for run, until in runs]
    pos, neg = [p for p, _ in rates], [n for _, n in rates]
    diff = [n - p for p, n in rates if p is not None and n is not None]
    m, se, n = mean_se(diff)
    if n < 2:
        return Claim("C6", title, UNTESTABLE, f"needs ≥ 2 collapsing runs; {evidence_of_one(diff)}")
    ok = m is not None and m > 2 * (se or 0)
    evidence = (
        f"{len(runs)} collapsing runs, up to the collapse: over-update rate (beyond dppo_binary_tv's bound) "
        f"A < 0 {over_seeds(neg)} vs A > 0 {over_seeds(pos)}"
    )
    fig = _bar("C6: over-update rate by advantage sign (collapsing runs)", ["A > 0", "A < 0"], [pos, neg], "rate")
    return Claim("C6", title, HOLDS if ok else FAILS, evidence, fig)


def measure_claims(runs, outcomes: pl.DataFrame | None = None) -> list[Claim]:
    """C1–C6 (module docstring) over `runs` (trustlens Runs of several rules and seeds);
    `outcomes`: their `run_outcomes`, one row per run in the same order, when already computed."""
    r = _Runs(list(runs), outcomes)
    return [f(r) for f in (_c1, _c2, _c3, _c4, _c5, _c6)]


__all__ = ["FAILS", "HOLDS", "UNTESTABLE", "Claim", "alert_leads", "measure_claims", "outcome_rows"]
