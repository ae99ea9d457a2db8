import itertools

import numpy as np
import plotly.graph_objects as go
import polars as pl
import pytest

from trustlens import analysis as A
from trustlens import plots as P
from trustlens.run import load_run
from trustlens.synthetic import HOSTILE_VOCAB, write_synthetic_run

RULES = ["ppo", "dppo_binary_tv", "dppo_binary_kl"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = write_synthetic_run(
        tmp_path_factory.mktemp("plots") / "run",
        steps=20,
        samples_per_step=16,
        seq_len=24,
        rules=RULES,
        collapse_at=14,
        vocab=HOSTILE_VOCAB + ("ok",) * 4,
    )
    return load_run(path)


def _points(fig: go.Figure) -> int:
    """Data points (or heatmap cells) a figure sends to the browser."""
    total = 0
    for tr in fig.data:
        if getattr(tr, "z", None) is not None:
            total += int(np.size(tr.z))
        elif getattr(tr, "x", None) is not None:
            total += len(tr.x)
        elif getattr(tr, "y", None) is not None:
            total += len(tr.y)
    return total


def _strings(fig: go.Figure) -> list[str]:
    """Every string a figure will render as (pseudo-)HTML: labels, names, hover and trace text."""
    out = []

    def walk(v):
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif isinstance(v, np.ndarray) and v.dtype == object:
            for x in v.ravel():
                walk(x)

    walk(fig.to_plotly_json())
    return out


def test_figure1_pair(run):
    t = run.tokens
    fig = P.figure1(
        A.figure1_density(t, "ratio", rules=["ppo"], n_x=40, n_y=30),
        A.figure1_density(t, "binary_tv", n_x=40, n_y=30),
        A.rule_boundaries(run.rules),
        rule="ppo",
    )
    heat = [tr for tr in fig.data if tr.type == "heatmap"]
    assert len(heat) == 2 and np.shape(heat[0].z) == (30, 40)
    lines = {(tr.name, tr.line.dash) for tr in fig.data if tr.type == "scatter"}
    assert {("ppo", "solid"), ("ppo", "dash"), ("dppo_binary_tv", "solid"), ("dppo_binary_kl", "dash")} <= lines
    # log10 of the counts sums back to the token total
    assert np.nansum(10 ** np.asarray(heat[0].z, float)) == pytest.approx(t.select(pl.len()).collect().item())
    assert _points(fig) < 10_000


def test_figures_name_the_anchor_policy(run):
    """A run without μ is anchored on π_old: axes, titles and hover say so."""
    t = run.tokens
    density = A.figure1_density(t, "ratio", n_x=10, n_y=10)
    fig = P.figure1(density, A.figure1_density(t, "binary_tv", n_x=10, n_y=10), anchor="π_old")
    assert fig.layout.xaxis.title.text == "π_old(a_t)" and fig.layout.yaxis.title.text == "π/π_old"
    assert [a.text for a in fig.layout.annotations] == ["ratio π/π_old vs π_old", "binary TV |π − π_old| vs π_old"]
    assert "log10 π_old" in fig.data[0].hovertemplate and "μ" not in fig.data[0].hovertemplate
    bars = P.blocked_by_bucket_bar(A.blocked_by_bucket(t, ["ppo"]), anchor="π_old")
    assert bars.layout.xaxis.title.text == "π_old(a_t)" and bars.data[0].hovertemplate.startswith("π_old in ")
    assert P.figure1(density, density).layout.xaxis.title.text == "μ(a_t)"  # μ by default


def test_bar_and_heatmap_figures(run):
    t = run.tokens
    bar = P.blocked_tokens_bar(A.blocked_by_token(t, top=5), top=5)
    assert [tr.name for tr in bar.data] == RULES[: len(bar.data)] and len(bar.data) >= 1
    assert max(len(tr.y) for tr in bar.data) <= 5
    buckets = P.blocked_by_bucket_bar(A.blocked_by_bucket(t))
    assert [tr.name for tr in buckets.data] == RULES and len(buckets.data[0].x) == 6
    heat = P.confusion_heatmap(A.confusion_matrix(t))
    assert np.shape(heat.data[0].z) == (3, 3) and np.diag(np.asarray(heat.data[0].z, float)).tolist() == [0, 0, 0]
    lines = P.blocked_per_step_lines(A.blocked_per_step(t))
    assert len(lines.data) == 3 and len(lines.data[0].x) == 20
    conf = P.confusion_lines(A.rule_confusion(t, "ppo", "dppo_binary_tv"), "ppo", "dppo_binary_tv")
    assert [tr.name for tr in conf.data] == ["only ppo", "only dppo_binary_tv"]


def test_token_text_is_escaped(run):
    fig = P.blocked_tokens_bar(A.blocked_by_token(run.tokens, top=20))
    text = " ".join(_strings(fig))
    assert "<script" not in text and "<img" not in text and "<b>" not in text
    assert "&lt;script&gt;" in text
    labels = [y for tr in fig.data for y in tr.y]
    assert "‹&lt;b&gt;bold&lt;/b&gt;›" in labels and not any("<" in y for y in labels)
    assert P.safe_text("$x$") == "&#36;x&#36;"
    assert P.safe_text("a\u202eb") == "a\\u202eb"
    labels = P.token_labels([" a", "\u00a0a", "a"])
    assert len(set(labels)) == 3


def test_mismatch_and_collapse_figures(run):
    mm = P.mismatch_curves(A.mismatch_per_step(run.tokens))
    # each panel named by its title and with a legend of its own (the values per step, the trend)
    titles = [a.text for a in mm.layout.annotations]
    assert [t.split(":")[0] for t in titles] == list(P.MISMATCH_CURVES)
    assert all(" → " in t and t.endswith("over the run") for t in titles)
    legends = [mm.layout[f"legend{i if i > 1 else ''}"] for i in range(1, len(P.MISMATCH_CURVES) + 1)]
    assert [lg.title.text for lg in legends] == list(P.MISMATCH_CURVES)
    for i, lg in enumerate(legends, start=1):
        mine = [tr for tr in mm.data if tr.legend == (f"legend{i}" if i > 1 else "legend")]
        assert [tr.name.split(" (")[0] for tr in mine] == ["per step", "trend"]
        assert {tr.yaxis for tr in mine} == {f"y{i if i > 1 else ''}"}
        assert lg.y == mm.layout[f"yaxis{i if i > 1 else ''}"].domain[1] and lg.x > 1  # beside its panel
    assert mm.layout.yaxis.exponentformat == "e"  # 2e-4, never SI's 200μ

    empty = P.mismatch_curves(A.mismatch_per_step(run.tokens).clear(), reason="μ <not> recorded")
    assert not empty.data and empty.layout.annotations[0].text == "μ &lt;not&gt; recorded"
    with pytest.raises(ValueError, match="metrics"):
        P.mismatch_curves(A.mismatch_per_step(run.tokens), ["nope"])
    assert len(P.mismatch_by_bucket_bar(A.mismatch_by_bucket(run.tokens)).data[0].x) == 6
    signals = A.step_signals(run)
    alerts = A.detect_collapse(run, signals=signals)
    fig = P.collapse_timeline(signals, alerts)
    markers = [tr for tr in fig.data if tr.mode == "markers"]
    assert sum(len(tr.x) for tr in markers) == alerts.height > 0
    assert all(x >= 14 for tr in markers for x in tr.x)


def test_collapse_timeline_joins_the_evaluations():
    accuracy = [0.4 - s / 100 if s % 10 == 0 else None for s in range(21)]  # evaluations at 0, 10, 20
    signals = pl.DataFrame({"step": range(21), "reward": [0.5] * 21, "accuracy": accuracy})
    alerts = pl.DataFrame(
        {"step": [20], "signal": ["accuracy"], "severity": ["critical"], "message": ["held-out accuracy fell"]}
    )
    fig = P.collapse_timeline(signals, alerts)
    reward, accuracy, marker = fig.data
    assert len(reward.x) == 21 and list(accuracy.x) == [0, 10, 20]
    assert (reward.mode, accuracy.mode) == ("lines", "lines+markers")
    assert list(accuracy.y) == pytest.approx([0.4, 0.3, 0.2])
    assert (list(marker.x), list(marker.y)) == ([20], [pytest.approx(0.2)])


def test_overlay_runs_escapes_names(run):
    s = A.step_summary(run.tokens)
    fig = P.overlay_runs({"a": s, "<b>evil</b>": s}, ["entropy", "blocked_ppo", "missing"])
    assert [tr.name for tr in fig.data[:2]] == ["a", "&lt;b&gt;evil&lt;/b&gt;"]
    assert len(fig.data) == 4  # two runs × two present columns


def test_overlay_runs_joins_a_sparse_signal_across_its_evaluations():
    accuracy = [0.4 - s / 100 if s % 10 == 0 else None for s in range(21)]  # evaluations at 0, 10, 20
    frame = pl.DataFrame({"step": range(21), "entropy": [1.0] * 20 + [None], "accuracy": accuracy})
    entropy, acc = P.overlay_runs({"a": frame}, ["entropy", "accuracy"]).data
    assert list(acc.x) == [0, 10, 20] and list(acc.y) == pytest.approx([0.4, 0.3, 0.2])
    assert acc.mode == "lines+markers"
    assert list(entropy.x) == list(range(20)) and entropy.mode == "lines"  # no value at the last step: no gap


def test_accuracy_curve_draws_the_evaluations_and_the_collapse_line():
    fig = P.accuracy_curve([(20, 0.5), (0, 0.44), (10, 0.2)])
    (line,) = fig.data
    assert list(line.x) == [0, 10, 20] and list(line.y) == [0.44, 0.2, 0.5]  # in step order
    (half,) = fig.layout.shapes
    assert half.y0 == half.y1 == pytest.approx(0.22) and half.line.dash == "dash"


def test_large_series_are_thinned():
    n = 50_000
    df = pl.DataFrame(
        {
            "step": np.arange(n),
            "k3_kl": np.linspace(0, 1, n),
            "mismatch_kl": np.zeros(n),
            "prob_diff_mean": np.zeros(n),
            "chi2_token": np.zeros(n),
        }
    )
    fig = P.mismatch_curves(df)
    assert all(len(tr.x) <= P.MAX_POINTS for tr in fig.data)
    thinned = P.thin(df, max_points=100)
    assert thinned.height == 100 and thinned["k3_kl"].mean() == pytest.approx(0.5, rel=1e-3)
    fig = P.overlay_runs({"big": df}, "k3_kl", max_points=500)
    assert len(fig.data[0].x) == 500


def test_empty_inputs_draw_a_message():
    empty = pl.DataFrame()
    for fig in (
        P.blocked_tokens_bar(pl.DataFrame(schema={"rule": pl.String, "token": pl.String})),
        P.collapse_timeline(pl.DataFrame(schema={"step": pl.Int32})),
        P.overlay_runs({}, "entropy"),
        P.accuracy_curve([]),
        P.confusion_heatmap(empty.with_columns()),
    ):
        assert isinstance(fig, go.Figure) and fig.layout.annotations


def test_mismatch_trend_and_change():
    n = 50
    df = pl.DataFrame({"step": np.arange(n), "k3_kl": np.linspace(0.0, 1.0, n), "flat": np.full(n, 2.0)})
    trend = A.mismatch_trend(df, ["k3_kl", "flat"])
    assert trend.window == 5
    change = dict(trend.summary.select("metric", "change").iter_rows())
    # centred mean of a line: the ends average the 3 points within reach, 1/49 in from each end
    assert change["k3_kl"] == pytest.approx(1.0 - 2 / 49) and change["flat"] == pytest.approx(0.0)
    assert A.mismatch_trend(df.head(1), ["k3_kl"]).summary["change"][0] is None


def test_every_title_from_a_run_is_escaped(run):
    evil = "<a href='https://x.example'>rule</a>"
    s = A.step_summary(run.tokens).rename({"blocked_ppo": f"blocked_{evil}"})
    figs = [
        P.overlay_runs({evil: s}, ["entropy", f"blocked_{evil}"], title=evil),
        P.confusion_lines(pl.DataFrame(), evil, "ppo"),
        P.blocked_per_step_lines(pl.DataFrame(), title=evil),
        P.mismatch_curves(A.mismatch_per_step(run.tokens), title=evil),
        P.mismatch_by_bucket_bar(A.mismatch_by_bucket(run.tokens), title=evil),
        P.collapse_timeline(s.select("step", "entropy", f"blocked_{evil}"), title=evil),
        P.confusion_heatmap(pl.DataFrame(), title=evil),
    ]
    for fig in figs:
        text = " ".join(_strings(fig))
        assert "<a" not in text and "&lt;a href" in text, fig.layout.title.text


def test_confusion_heatmap_stays_readable_with_every_rule():
    from trustlens.rules import RULES

    rules = list(RULES)
    matrix = pl.DataFrame(
        {
            "rule_a": [a for a in rules for _ in rules],
            "rule_b": [b for _ in rules for b in rules],
            "count": [10] * len(rules) ** 2,
            "only_a": [1] * len(rules) ** 2,
            "only_a_frac": [0.1] * len(rules) ** 2,
        }
    )
    fig = P.confusion_heatmap(matrix)
    # cells of ≥ 34 px per rule, slanted rule names with room made for them, small cell text
    assert fig.layout.height >= 34 * len(rules) + 200
    assert fig.layout.xaxis.tickangle == -40 and fig.layout.xaxis.automargin
    assert fig.data[0].textfont.size <= 9


def test_float_noise_is_drawn_as_zero():
    df = pl.DataFrame({"step": [0, 1, 2], "k3_kl": [1.8e-15, -3e-12, 2e-9]})
    assert P.zero_noise(df, ["k3_kl"])["k3_kl"].to_list() == [0.0, 0.0, 2e-9]
    # below 1e-9 of the column's scale: with values of 500, 4e-7 is rounding, 6e-7 is not
    big = pl.DataFrame({"chi2": [500.0, 4e-7, -6e-7, float("inf")]})
    assert P.zero_noise(big, ["chi2"])["chi2"].to_list() == [500.0, 0.0, -6e-7, float("inf")]
    assert P.noise_to_zero(4e-7, 500.0) == 0.0 and P.noise_to_zero(4e-7) == 4e-7


def test_float_noise_is_no_trend_in_the_mismatch_titles():
    """Where μ = π_old every mismatch quantity is rounding (1e-15): drawn, titled and ticked as 0."""
    n = 40
    rng = np.random.default_rng(0)
    noise = {m: rng.normal(0, 1e-15, n) + np.linspace(0, 1e-13, n) for m in P.MISMATCH_CURVES}
    fig = P.mismatch_curves(pl.DataFrame({"step": np.arange(n), **noise}))
    assert [a.text for a in fig.layout.annotations] == [f"{m}: trend 0 → 0 over the run" for m in P.MISMATCH_CURVES]
    assert all(set(tr.y) == {0.0} for tr in fig.data)


def test_mismatch_titles_use_the_one_number_format():
    """The demo's flat k3 (8.9e-5 → 9.1e-5): its ends in the title as tiles write them, not a
    lone '+2.3e-06' that reads as a trend."""
    n = 40
    k3 = np.full(n, 8.94e-5) + np.linspace(0, 2e-6, n)
    df = pl.DataFrame({"step": np.arange(n), "k3_kl": k3})
    trend = A.mismatch_trend(df, ["k3_kl"]).summary.row(0, named=True)
    (title,) = [a.text for a in P.mismatch_curves(df, ["k3_kl"]).layout.annotations]
    assert title == f"k3_kl: trend {P.decimal(trend['first'])} → {P.decimal(trend['last'])} over the run"
    assert title == "k3_kl: trend 8.95e-5 → 9.13e-5 over the run"


def test_the_number_format():
    assert [P.decimal(v) for v in (0.0, 0.2194, 1.6e-4, -2.3e-6, 12345.0, 1e-4, float("inf"), None)] == [
        "0",
        "0.219",
        "1.6e-4",
        "-2.3e-6",
        "1.23e4",
        "1e-4",
        "∞",
        "n/a",
    ]
    assert P.decimal(1.6e-5, 4) == "1.6e-5" and P.decimal(0.012345, 4) == "0.01235"
    assert [P.signed(v) for v in (2.03e-6, -0.004, 0.0)] == ["+2.03e-6", "-0.004", "0"]
    assert [P.count(n) for n in (9999, 32_000, 307_200, 1_234_567, None)] == ["9,999", "32k", "307k", "1.23M", "n/a"]
    assert [P.percent(f) for f in (0.022, 0.75, 0.000213, None)] == ["2.2 %", "75 %", "0.0213 %", "n/a"]
    rates = ["blocked_ppo", "blocked_frac_pos", "block_rate_mean", "zero_adv_frac", "only_a_frac", "over_frac_neg"]
    assert all(P.is_rate(c) for c in rates)
    assert not any(P.is_rate(c) for c in ("k3_kl", "entropy", "reward", "accuracy", "blocked", "tokens"))
    df = pl.DataFrame({"blocked_ppo": [0.1], "blocked_count": [3], "entropy": [0.5]})
    assert P.rate_columns(df) == ["blocked_ppo"]


def test_the_rules_legend_sits_under_the_block_rate_panel(run):
    signals = A.step_signals(run)
    fig = P.collapse_timeline(signals, panels=("entropy", "reward"))
    rules = [tr for tr in fig.data if f"blocked_{tr.name}" in signals.columns]
    assert rules and all(tr.legend == "legend2" for tr in rules)  # not in the top panels' legend
    legend = fig.layout.legend2  # in rows under the last panel, the block rates', taking no width
    assert (legend.orientation, legend.yref, legend.y, legend.yanchor) == ("h", "container", 0, "bottom")
    rows = -(-len(rules) // 2)  # two entries a row
    assert fig.layout.height == P.runs.PANEL_PX * 3 + 120 + P.common.LEGEND_ROW_PX * rows
    heat = P.confusion_heatmap(A.confusion_matrix(run.tokens))
    # counts, which differ where rates print 0.0 %, as the cells' text (a heatmap prints no customdata)
    only = A.confusion_matrix(run.tokens).row(1, named=True)
    rules = list(heat.data[0].y)
    cell = heat.data[0].text[rules.index(only["rule_a"])][rules.index(only["rule_b"])]
    assert heat.data[0].texttemplate == "%{text}" and cell == f"{only['only_a']:,.0f}"


# ---------------------------------------------------------------- one number format in every figure


def _every_figure(run) -> dict[str, go.Figure]:
    """Every figure the plots package builds, drawn for `run` as the dashboard, the report and
    the notebooks call them (several runs overlaid: the run twice, block rates included)."""
    t = run.tokens
    signals = A.step_signals(run)
    alerts = A.detect_collapse(run, signals=signals)
    return {
        "figure1": P.figure1(
            A.figure1_density(t, "ratio", rules=["ppo"], n_x=20, n_y=20),
            A.figure1_density(t, "binary_tv", n_x=20, n_y=20),
            A.rule_boundaries(run.rules),
            rule="ppo",
        ),
        "blocked_tokens_bar": P.blocked_tokens_bar(A.blocked_by_token(t, top=5), top=5),
        "blocked_by_bucket_bar": P.blocked_by_bucket_bar(A.blocked_by_bucket(t)),
        "blocked_per_step_lines": P.blocked_per_step_lines(A.blocked_per_step(t)),
        "confusion_heatmap": P.confusion_heatmap(A.confusion_matrix(t)),
        "confusion_lines": P.confusion_lines(A.rule_confusion(t, "ppo", "dppo_binary_tv"), "ppo", "dppo_binary_tv"),
        "mismatch_curves": P.mismatch_curves(A.mismatch_per_step(t)),
        "mismatch_by_bucket_bar": P.mismatch_by_bucket_bar(A.mismatch_by_bucket(t)),
        "collapse_timeline": P.collapse_timeline(signals, alerts),
        "overlay_runs": P.overlay_runs({"a": signals, "b": signals}, ["entropy", "blocked_ppo", "k3_kl"]),
        "accuracy_curve": P.accuracy_curve([(0, 0.5), (10, 0.4), (20, 0.2)]),
        # the run is dense: flips per layer as trustlens.routing.flips_per_layer gives them for an MoE run
        "routing_flips_heatmap": P.routing_flips_heatmap(
            pl.DataFrame({"step": [0, 0, 1, 1], "layer": [1, 2, 1, 2], "flip_rate": [0.1, 0.2, 0.3, 0.0]})
        ),
    }


def _axes(fig: go.Figure) -> dict[str, dict]:
    """Every axis and colour bar of `fig` as plotly.js gets it: layout x/y axes, colour axes'
    and traces' colour bars."""
    layout = fig.to_plotly_json()["layout"]
    out = {k: v for k, v in layout.items() if k.startswith(("xaxis", "yaxis"))}
    out |= {f"{k}.colorbar": v.get("colorbar", {}) for k, v in layout.items() if k.startswith("coloraxis")}
    out |= {f"trace {i}.colorbar": tr.colorbar.to_plotly_json() for i, tr in enumerate(fig.data) if "colorbar" in tr}
    return out


def test_every_figure_is_walked(run):
    """The walk below builds every public function of the package that draws a figure (those
    taking a figure to adjust it aside)."""
    import inspect

    drawing = set()
    for name in P.__all__:
        fn = getattr(P, name)
        if inspect.isfunction(fn):
            sig = inspect.signature(fn)
            if sig.return_annotation in (go.Figure, "go.Figure") and "fig" not in sig.parameters:
                drawing.add(name)
    assert set(_every_figure(run)) == drawing


def test_no_axis_uses_si_prefixes(run):
    """Every axis and colour bar of every figure: plain decimals or 1.6e-4 (exponentformat "e",
    no d3 "s" tick format, which writes 6f, 10n, 200μ)."""
    for name, fig in _every_figure(run).items():
        axes = _axes(fig)
        assert axes, name
        for axis, spec in axes.items():
            assert spec.get("exponentformat") == "e", f"{name} {axis}: {spec.get('exponentformat')}"
            assert not str(spec.get("tickformat", "")).endswith("s"), f"{name} {axis}: {spec['tickformat']}"


def _rate_axes(fig: go.Figure) -> list[str]:
    """The y axes (and colour bars) of `fig` that show a rate: titled as a blocked fraction or
    share, or the axis of a panel titled with a rate's name."""
    found = []
    for key, spec in _axes(fig).items():
        title = (spec.get("title") or {}).get("text", "") or ""
        shows_rate = "fraction" in title or "share" in title or P.is_rate(title)
        if shows_rate and (key.startswith("yaxis") or key.endswith("colorbar")):
            found.append(key)
    for ann in fig.layout.annotations:  # subplot titles: the panel of y axis n is the n-th row
        text = ann.text or ""
        if ann.yref == "paper" and (P.is_rate(text) or text.startswith("blocked fraction")):
            row = [a.text for a in fig.layout.annotations].index(text) + 1
            found.append(f"yaxis{row if row > 1 else ''}")
    return found


def test_block_rates_are_percentages(run):
    """Every axis and hover text that shows a block rate or a share writes it in percent, in
    the one format (RATE_FORMAT: 3 significant digits, 2.13%)."""
    import re

    expected = {
        "blocked_by_bucket_bar": ["yaxis"],
        "blocked_per_step_lines": ["yaxis"],
        "confusion_heatmap": ["trace 0.colorbar"],
        "confusion_lines": ["yaxis"],
        "collapse_timeline": [f"yaxis{len(_every_figure(run)['collapse_timeline'].layout.annotations)}"],
        "overlay_runs": ["yaxis2"],
        "routing_flips_heatmap": ["trace 0.colorbar"],
    }
    for name, fig in _every_figure(run).items():
        axes = _axes(fig)
        rate = sorted(set(_rate_axes(fig)))
        assert rate == sorted(expected.get(name, [])), name
        for key in rate:
            assert axes[key].get("tickformat") == P.RATE_FORMAT, f"{name} {key}"
        for tr in fig.data:  # a percentage in hover text is in RATE_FORMAT
            hover = tr.hovertemplate or ""
            assert all(f == P.RATE_FORMAT for f in re.findall(r"%\{[^}:]*:([^}]*%|[^}]*p)\}", hover)), hover
    timeline = _every_figure(run)["collapse_timeline"]
    rules = [tr for tr in timeline.data if tr.legend == "legend2"]
    assert rules and all(P.RATE_FORMAT in tr.hovertemplate for tr in rules)


@pytest.mark.parametrize("shown", [None, {"ppo"}])
def test_block_rate_charts_draw_the_shown_rules_and_list_the_others(run, shown):
    """The rules in `shown` are drawn, the others listed in the legend (one click draws them)."""
    signals = A.step_signals(run)
    figures = [
        P.blocked_per_step_lines(A.blocked_per_step(run.tokens), shown=shown),
        P.collapse_timeline(signals, panels=("entropy",), shown=shown),
    ]
    for fig in figures:
        rules = {tr.name: tr.visible for tr in fig.data if f"blocked_{tr.name}" in signals.columns}
        assert len(rules) > 1
        expected = {r: True if shown is None or r in shown else "legendonly" for r in rules}
        assert rules == expected


def test_timeline_panels_leave_room_for_their_titles(run):
    """TITLE_GAP_PX between two panels of the plot area (the figure less its 180 px of margins)."""
    fig = P.collapse_timeline(A.step_signals(run), panels=("entropy", "reward"))
    tops = [fig.layout[f"yaxis{i or ''}"].domain for i in (0, 2, 3)]
    area = P.runs.PANEL_PX * 3 + 120 - 180
    for above, below in itertools.pairwise(tops):
        assert (above[0] - below[1]) * area == pytest.approx(P.runs.TITLE_GAP_PX)


def test_collapse_timeline_alert_traces_in_the_alerts_order():
    signals = pl.DataFrame({"step": range(21), "reward": [0.5] * 21})
    alerts = pl.DataFrame(
        {
            "step": [5, 10, 15],
            "signal": ["reward"] * 3,
            "severity": ["warning", "critical", "info"],
            "message": ["a", "b", "c"],
        }
    )
    for _ in range(5):  # group_by's order is not stable across calls unless kept
        names = [tr.name for tr in P.collapse_timeline(signals, alerts).data if tr.mode == "markers"]
        assert names == ["warning alert", "critical alert", "info alert"]
