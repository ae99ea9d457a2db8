"""The sections of the static report, one function each: a run in, HTML out.

Every number comes from `trustlens.analysis` and every figure from `trustlens.plots` — the same
functions the dashboard pages call — so the report and the dashboard agree. Text read from a run
(token text, prompts, run and rule names, alert messages) is escaped here or by the plot
functions; the report holds no markup from a run.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import plotly.graph_objects as go
import polars as pl

from trustlens import plots
from trustlens.analysis import (
    blocked_by_bucket,
    blocked_by_token,
    blocked_per_step,
    detect_collapse,
    exact_aggregates,
    figure1_density,
    mismatch_per_step,
    mismatch_unavailable,
    rule_boundaries,
    rule_confusion,
    step_signals,
    step_summary,
)
from trustlens.analysis.agreement import default_rule_pair
from trustlens.analysis.tokens import ANCHOR_SYMBOLS, anchor_column, sample_text, sample_tokens
from trustlens.core.render import colored_tokens_html, legend_html
from trustlens.export.exporters import driving_tokens
from trustlens.run import BLOCKED_PREFIX, NoRowsError

# token rows the colour-coded sample shows at most
SAMPLE_TOKENS = 400


def figure_html(fig: go.Figure) -> str:
    """A figure as a <div> drawn by the plotly.js the report inlines once."""
    return fig.to_html(full_html=False, include_plotlyjs=False, config={"displaylogo": False})


def esc(text: object) -> str:
    return html.escape("" if text is None else str(text))


def number(value: object, fmt: str | None = None) -> str:
    """A cell or a fact: `fmt` ("d", ".3%") when given, else the dashboard's format
    (`plots.decimal` with 4 significant digits: 1.6e-4, never 1.6e-04); "–" for none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return esc(value)
    if fmt is not None:
        return "∞" if value == math.inf else "−∞" if value == -math.inf else format(value, fmt)
    return str(value) if isinstance(value, int) else plots.decimal(value, 4)


def table_html(df: pl.DataFrame, formats: dict[str, str] | None = None, percent: Sequence[str] = ()) -> str:
    """`df` as an HTML table, every cell escaped; the rate columns (`plots.is_rate`) and those
    named in `percent` as percentages."""
    formats = formats or {}
    rates = {*plots.rate_columns(df), *percent}
    head = "".join(f"<th>{esc(c)}</th>" for c in df.columns)
    cells = (
        "".join(
            f"<td>{plots.percent(v) if c in rates and v is not None else number(v, formats.get(c))}</td>"
            for c, v in zip(df.columns, row, strict=True)
        )
        for row in df.iter_rows()
    )
    rows = "".join(f"<tr>{c}</tr>" for c in cells)
    return f'<table class="tl-table"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


def rules_of(run) -> list[str]:
    names = run.tokens.collect_schema().names()
    return [c.removeprefix(BLOCKED_PREFIX) for c in names if c.startswith(BLOCKED_PREFIX)]


def overview(run) -> str:
    """Steps, rows, accuracy and reward at the start and the end, and per rule the block rate over
    the run's A ≠ 0 tokens beside the A = 0 share; the block-rate and signal curves."""
    aggregates = exact_aggregates(run)
    summary = step_summary(run.tokens, aggregates=aggregates)
    metrics = run.metrics.collect()

    def ends(name: str) -> str:
        m = metrics.filter(pl.col("name") == name).group_by("step").agg(pl.col("value").mean()).sort("step")
        return "–" if m.is_empty() else f"{number(m['value'][0])} → {number(m['value'][-1])}"

    facts = [
        ("status", esc(run.status)),
        ("active rule", esc(run.active_rule or "–")),
        ("steps", f"{summary.height} (steps {summary['step'][0]}–{summary['step'][-1]})"),
        (
            "tokens",
            f"{int(summary['tokens'].sum()):,}" + (" (sampled run: exact, from its aggregates)" if run.sampled else ""),
        ),
        ("held-out accuracy (first → last evaluation)", ends("eval/accuracy")),
        ("mean reward (first → last step)", ends("reward/mean")),
    ]
    facts_html = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts)
    blocked = blocked_per_step(run.tokens, aggregates=aggregates)
    rate_rows = (
        blocked.group_by("rule", maintain_order=True)
        .agg((pl.col("blocked").sum() / pl.col("count").sum()).alias("blocked over A ≠ 0 tokens"))
        .select("rule", pl.col("blocked over A ≠ 0 tokens").cast(pl.Float64))
    )
    zero = float((summary["zero_adv_frac"] * summary["tokens"]).sum()) / float(summary["tokens"].sum())
    signals = step_signals(run)
    alerts = detect_collapse(run, signals=signals)
    return (
        f'<table class="tl-facts">{facts_html}</table>'
        f"<p>Tokens with A = 0 (no gradient, never blocked, not in the block rates): "
        f"{plots.percent(zero)} of the tokens.</p>"
        + table_html(rate_rows, percent=["blocked over A ≠ 0 tokens"])
        + figure_html(plots.blocked_per_step_lines(blocked))
        + figure_html(plots.collapse_timeline(signals, alerts, panels=("entropy", "reward", "accuracy")))
    )


def ppo_vs_dppo(run) -> str:
    """Two rules on the same tokens (the dashboard's default pair): agreement, Figure 1, blocked
    fraction by μ bucket, most-blocked tokens."""
    rules = rules_of(run)
    if len(rules) < 2:
        return "<p>This run holds fewer than two rules' decisions: nothing to compare.</p>"
    a, b = default_rule_pair(rules)
    pair = (a, b)
    tokens = run.tokens
    anchor = ANCHOR_SYMBOLS[anchor_column(tokens)]
    aggregates = exact_aggregates(run)  # the recorded rules' counts over every token of a sampled run
    total = rule_confusion(tokens, a, b, per_step=False, aggregates=aggregates).row(0, named=True)
    head = (
        f"<p>{esc(a)} against {esc(b)} on the {total['count']:,} A ≠ 0 tokens both decided: "
        f"blocked by both {total['both']:,}, only by {esc(a)} {total['only_a']:,} "
        f"({plots.percent(total['only_a_frac'])}), only by {esc(b)} {total['only_b']:,} "
        f"({plots.percent(total['only_b_frac'])}); agreement {plots.percent(total['agreement'])}.</p>"
    )
    return (
        head
        + figure_html(plots.confusion_lines(rule_confusion(tokens, a, b, aggregates=aggregates), a, b))
        + figure_html(
            plots.figure1(
                figure1_density(tokens, y="ratio", rules=pair),
                figure1_density(tokens, y="binary_tv", rules=pair),
                rule_boundaries({r: run.rules.get(r, {}) for r in pair}),
                rule=a,
                title=f"Ratio and TV against {anchor} (DPPO paper, Figure 1)",
                anchor=anchor,
            )
        )
        + figure_html(
            plots.blocked_by_bucket_bar(
                blocked_by_bucket(tokens, rules=pair), title=f"Blocked fraction by {anchor} bucket", anchor=anchor
            )
        )
        + figure_html(plots.blocked_tokens_bar(blocked_by_token(tokens, rules=pair, top=15)))
    )


def mismatch(run) -> str:
    reason = mismatch_unavailable(run.tokens)
    if reason is not None:
        return f"<p>No mismatch to show: {esc(reason)}</p>"
    return figure_html(plots.mismatch_curves(mismatch_per_step(run.tokens, aggregates=exact_aggregates(run))))


def alerts(run) -> str:
    """The collapse alerts, then the tokens that drove each one."""
    found = detect_collapse(run)
    if found.is_empty():
        return "<p>No collapse alert: no signal left the run's trailing baseline.</p>"
    listed = found.select("step", "end_step", "severity", "kind", "signal", "message")
    return (
        table_html(listed, {"step": "d", "end_step": "d"})
        + "<h4>Driving tokens</h4>"
        + "<p>Each alert's tokens in the order of the alerts above, strongest first; mu, pi_old and pi "
        "are the token's probabilities under μ, π_old and π (mismatch_growth ranks by μ against "
        "π_old). How each alert scores its tokens: docs/dashboard.md, “Collapse alerts”.</p>"
        + table_html(driving_tokens(run, found), {"alert_step": "d", "sample": "d", "update": "d", "pos": "d"})
    )


def token_sample(run) -> str:
    """One response coloured by its ratio π/μ, blocked tokens ringed per rule: the sample of the
    last step whose tokens the run's rules block most."""
    tokens = run.tokens
    rules = rules_of(run)
    last = tokens.select(pl.col("step").max()).collect().item()
    blocked = pl.sum_horizontal(pl.col(BLOCKED_PREFIX + r).fill_null(False).cast(pl.Int32) for r in rules)
    pick = (
        tokens.filter(pl.col("step") == last)
        .group_by("sample")
        .agg(blocked.sum().alias("blocked"))
        .sort(["blocked", "sample"], descending=[True, False])
        .head(1)
        .collect()
    )
    if pick.is_empty():
        return "<p>No token rows.</p>"
    sample = int(pick["sample"][0])
    rows = sample_tokens(tokens, sample, step=last).head(SAMPLE_TOKENS)
    text = sample_text(run.samples, sample, step=last) if run.files.get("samples") else None
    prompt = f"<p><b>Prompt</b></p><pre>{esc(text.get('prompt'))}</pre>" if text else ""
    quantity = "ratio" if "ratio" in rows.columns else "pi_logp"
    shown = [r for r in rules if BLOCKED_PREFIX + r in rows.columns]
    hover = [c for c in ("mu_logp", "pi_logp", "binary_tv", "advantage") if c in rows.columns and c != quantity]
    return (
        f"<p>Sample {sample} of step {last}, coloured by {esc(quantity)}; hover a token for its values.</p>"
        + prompt
        + legend_html(shown, quantity=quantity)
        + colored_tokens_html(
            rows["token"].to_list(),
            rows[quantity].to_list(),
            quantity=quantity,
            blocked={r: rows[BLOCKED_PREFIX + r].to_list() for r in shown},
            hover={c: rows[c].to_list() for c in hover},
            positions=rows["pos"].to_list(),
        )
    )


SECTIONS = (
    ("overview", "Overview", overview),
    ("ppo-vs-dppo", "PPO vs DPPO on the same tokens", ppo_vs_dppo),
    ("mismatch", "Training–inference mismatch", mismatch),
    ("alerts", "Collapse alerts and their driving tokens", alerts),
    ("tokens", "A colour-coded token sample", token_sample),
)


def run_sections(run) -> list[tuple[str, str, str]]:
    """(anchor, title, HTML) of every section for `run`; a section without rows says so."""
    out = []
    for anchor, title, build in SECTIONS:
        try:
            body = build(run)
        except NoRowsError as err:
            body = f"<p>{esc(err)}</p>"
        out.append((anchor, title, body))
    return out
