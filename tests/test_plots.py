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
    # one legend for every panel (the values per step, the trend), each panel named by its title
    assert {tr.name for tr in mm.data[::2]} == {"value per step"}
    assert [tr.showlegend for tr in mm.data] == [True, True] + [False] * (len(mm.data) - 2)
    titles = [a.text for a in mm.layout.annotations]
    assert [t.split(" (")[0] for t in titles] == list(P.MISMATCH_CURVES)
    assert "change over the run" in titles[0]
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


def test_the_rules_legend_sits_beside_the_block_rate_panel(run):
    signals = A.step_signals(run)
    fig = P.collapse_timeline(signals, panels=("entropy", "reward"))
    rules = [tr for tr in fig.data if f"blocked_{tr.name}" in signals.columns]
    assert rules and all(tr.legend == "legend2" for tr in rules)  # not in the top panels' legend
    assert fig.layout.legend2.y == fig.layout.yaxis3.domain[1]  # level with the last panel's top
    heat = P.confusion_heatmap(A.confusion_matrix(run.tokens))
    assert heat.data[0].texttemplate == "%{customdata:,.0f}"  # counts, which differ where rates print 0.0 %
