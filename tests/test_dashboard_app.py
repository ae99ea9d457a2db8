"""Every dashboard page through Streamlit's AppTest, on synthetic runs of every awkward kind, and
the `trustlens dashboard` launcher."""

import importlib
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from core.test_render import _parse
from streamlit.testing.v1 import AppTest

from trustlens import cli, dashboard
from trustlens.run import MANIFEST, SCHEMA_VERSION
from trustlens.run.parts import write_part
from trustlens.synthetic import HOSTILE_VOCAB, VOCAB, write_synthetic_run

APP = Path(__file__).resolve().parent.parent / "app"
ENTRY = APP / dashboard.ENTRY
PAGES = {
    "views/overview.py": "Overview",
    "views/token_inspector.py": "Token inspector",
    "views/ppo_vs_dppo.py": "PPO vs DPPO",
    "views/mismatch.py": "Mismatch",
    "views/collapse.py": "Collapse signals",
    "views/compare.py": "Compare runs",
}
RULES = ("ppo", "ppo_clip_higher", "dppo_binary_tv", "dppo_binary_kl", "dppo_topk_tv")
# Prompt text a hostile user could send: it must reach the page as text, never as markup.
HOSTILE_PROMPTS = (
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(2)>",
    "[click me](javascript:alert(3))",
    "**bold** $x$ :red[red]",
)
SIZES = dict(steps=8, samples_per_step=16, seq_len=24)
INSPECT_KEY = "tl_inspect"  # the session-state key of the token inspector's click-through target


def _hostile_prompts(run: Path) -> None:
    """Rewrite the run's samples with hostile prompts and responses."""
    for part in sorted((run / "samples").glob("rank=*/part-*.parquet")):
        table = pq.read_table(part)
        n = table.num_rows
        prompts = pa.array([HOSTILE_PROMPTS[i % len(HOSTILE_PROMPTS)] for i in range(n)], pa.string())
        table = table.set_column(table.schema.get_field_index("prompt"), "prompt", prompts)
        index = int(part.stem.split("-")[1])
        part.unlink()
        write_part(table, part.parent, index)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """A runs folder: a healthy multi-rank run, a collapsing one, one without μ, a hostile one."""
    root = tmp_path_factory.mktemp("runs")
    write_synthetic_run(root / "a_collapse", **SIZES, rules=RULES, collapse_at=5, seed=1)
    write_synthetic_run(root / "b_healthy", **SIZES, rules=RULES, updates=2, world_size=2, seed=2)
    write_synthetic_run(root / "c_no_mu", **SIZES, rules=("ppo", "dppo_binary_tv_recompute"), with_mu=False, seed=3)
    write_synthetic_run(
        root / "d_hostile", **SIZES, rules=RULES, seed=4, vocab=HOSTILE_VOCAB + VOCAB[: 64 - len(HOSTILE_VOCAB)]
    )
    _hostile_prompts(root / "d_hostile")
    _custom_rule(write_synthetic_run(root / "e_custom", **SIZES, rules=("ppo", "dppo_binary_tv"), seed=6))
    return root


CUSTOM = {"low": 0.15, "high": 0.15, "anchor": "mu", "measure": "binary_tv", "description": "a user's own rule"}


def _custom_rule(run: Path) -> None:
    """Turn the run's dppo_binary_tv into a custom rule `my_tv_rule` the registry does not know."""
    for part in sorted((run / "tokens").glob("rank=*/part-*.parquet")):
        table = pq.read_table(part)
        names = ["blocked_my_tv_rule" if n == "blocked_dppo_binary_tv" else n for n in table.column_names]
        index = int(part.stem.split("-")[1])
        part.unlink()
        write_part(table.rename_columns(names), part.parent, index)
    manifest = json.loads((run / MANIFEST).read_text())
    manifest["rules"] = {"ppo": manifest["rules"]["ppo"], "my_tv_rule": CUSTOM}
    (run / MANIFEST).write_text(json.dumps(manifest))


def _app(monkeypatch, root: Path) -> AppTest:
    monkeypatch.setenv(dashboard.RUNS_ENV, str(root))
    return AppTest.from_file(str(ENTRY), default_timeout=120)


def _pick_run(at: AppTest, name: str) -> AppTest:
    return at.sidebar.selectbox(key="tl_run").set_value(name).run()


def _open(at: AppTest, page: str) -> AppTest:
    at.switch_page(page).run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def _tile_names(at: AppTest) -> list[str]:
    """The tiles' names, without the scope their labels end with (" · run", " · step 7") and
    without markdown's escapes."""
    return [m.label.split(" · ")[0].replace("\\", "") for m in at.metric]


def _tile(at: AppTest, name: str):
    """The tile named `name` (its label before the scope, escapes aside)."""
    return next(m for m, shown in zip(at.metric, _tile_names(at), strict=True) if shown == name.replace("\\", ""))


def _page_text(at: AppTest) -> str:
    """All text the page shows, flattened (markdown, captions, text, alerts, html bodies)."""
    parts = [
        e.value
        for kind in ("markdown", "caption", "text", "info", "warning", "error", "title", "subheader")
        for e in getattr(at, kind)
    ]
    parts += [h.proto.body for h in at.get("html")]
    return "\n".join(str(p) for p in parts)


@pytest.mark.parametrize("run_name", ["a_collapse", "b_healthy", "c_no_mu", "e_custom"])
@pytest.mark.parametrize("page", list(PAGES))
def test_every_page_renders(monkeypatch, runs, run_name, page):
    at = _app(monkeypatch, runs).run()
    _pick_run(at, run_name)
    at = _open(at, page)
    assert PAGES[page] in [t.value for t in at.title]
    assert not at.error, [e.value for e in at.error]
    if run_name == "c_no_mu" and page != "views/compare.py":
        assert any("anchor is π_old" in i.value for i in at.info)


def test_overview_shows_key_figures_curves_and_alerts(monkeypatch, runs):
    at = _open(_pick_run(_app(monkeypatch, runs).run(), "a_collapse"), "views/overview.py")
    assert len(at.metric) >= 4
    assert len(at.get("plotly_chart")) >= 1
    assert "Accuracy" not in _tile_names(at)  # the run logged no evaluation


def test_sidebar_filters_are_shared_by_the_pages(monkeypatch, runs):
    at = _pick_run(_app(monkeypatch, runs).run(), "a_collapse")
    at.sidebar.selectbox(key="tl_rule").set_value("ppo").run()
    at.sidebar.text_input(key="tl_text").input(" the").run()
    for page in PAGES:
        at = _open(at, page)
        assert at.sidebar.selectbox(key="tl_rule").value == "ppo"
        assert at.sidebar.text_input(key="tl_text").value == " the"


def test_token_inspector_draws_the_sample_and_offers_downloads(monkeypatch, runs):
    at = _open(_pick_run(_app(monkeypatch, runs).run(), "b_healthy"), "views/token_inspector.py")
    bodies = [h.proto.body for h in at.get("html")]
    assert any("blocked by ppo" in b for b in bodies)  # the legend
    assert any(b.count("<span") > 5 and "title=" in b for b in bodies)  # the coloured tokens
    labels = [b.proto.label for b in at.get("download_button")]
    assert "Download CSV" in labels and "Download Parquet" in labels
    # colouring by another quantity redraws the tokens
    at.selectbox(key="tl_colour_by").set_value("entropy").run()
    assert not at.exception
    assert any("entropy = " in h.proto.body for h in at.get("html"))


def test_token_inspector_filters_narrow_the_samples(monkeypatch, runs):
    at = _open(_pick_run(_app(monkeypatch, runs).run(), "a_collapse"), "views/token_inspector.py")
    all_rows = at.dataframe[0].value["rows"].sum()
    at.sidebar.selectbox(key="tl_rule").set_value("dppo_binary_tv").run()
    at.sidebar.selectbox(key="tl_sign").set_value("neg").run()
    assert not at.exception
    df = at.dataframe[0].value
    assert 0 < df["rows"].sum() < all_rows
    assert (df["advantage"] < 0).all()
    assert (df["rows"] == df["blocked_dppo_binary_tv"]).all()
    at.sidebar.text_input(key="tl_text").input("no token has this text").run()
    assert any("No token matches" in w.value for w in at.warning)


def test_alert_opens_the_tokens_behind_it(monkeypatch, runs):
    at = _open(_pick_run(_app(monkeypatch, runs).run(), "a_collapse"), "views/overview.py")
    at.button(key="ov_alert_0").click().run()
    assert not at.exception
    assert next(t.value for t in at.title) == "Token inspector"
    assert any("Showing the tokens behind alert" in i.value for i in at.info)
    target = at.session_state[INSPECT_KEY]
    drivers = at.dataframe[0].value  # the alert's driving tokens
    assert len(drivers) > 0 and set(drivers["step"]) == {target["alert"]["drivers_step"]}  # the confirming step
    samples = at.dataframe[1].value  # the samples behind the alert
    assert set(samples["sample"]) == set(target["alert"]["samples"])


def test_chart_opens_the_tokens_of_a_step(monkeypatch, runs):
    at = _open(_pick_run(_app(monkeypatch, runs).run(), "b_healthy"), "views/overview.py")
    at.number_input(key="ov_blocked_step").set_value(3).run()
    at.button(key="ov_blocked_inspect").click().run()
    assert not at.exception
    assert next(t.value for t in at.title) == "Token inspector"
    assert any("step 3 of the chart" in i.value for i in at.info)
    assert set(at.dataframe[0].value["step"]) == {3}


def test_rule_disagreement_opens_the_tokens_behind_it(monkeypatch, runs):
    at = _open(_pick_run(_app(monkeypatch, runs).run(), "a_collapse"), "views/ppo_vs_dppo.py")
    assert at.selectbox(key="pv_a").value == "ppo" and at.selectbox(key="pv_b").value == "dppo_binary_tv"
    only_ppo = int(at.metric[2].value.replace(",", ""))
    at.button(key="pv_inspect_True").click().run()
    assert not at.exception
    assert next(t.value for t in at.title) == "Token inspector"
    samples = at.dataframe[0].value
    assert samples["rows"].sum() == only_ppo
    assert (samples["blocked_ppo"] == samples["rows"]).all() and (samples["blocked_dppo_binary_tv"] == 0).all()


def test_token_inspector_opens_from_query_params(monkeypatch, runs):
    at = _pick_run(_app(monkeypatch, runs).run(), "a_collapse")
    at.query_params["step"] = "3"
    at.query_params["sample"] = "50"
    at = _open(at, "views/token_inspector.py")
    assert at.selectbox(key="tl_sample").value == (3, 50)


def test_hostile_text_is_shown_as_text(monkeypatch, runs):
    at = _pick_run(_app(monkeypatch, runs).run(), "d_hostile")
    for page in PAGES:
        at = _open(at, page)
        for h in at.get("html"):
            parsed = _parse(h.proto.body)
            assert set(parsed.tags) <= {"div", "span", "br"}
            assert {name for name, _ in parsed.attrs} <= {"style", "title"}
    # the token inspector shows the hostile prompt verbatim as plain text and the tokens escaped
    at = _open(at, "views/token_inspector.py")
    assert any(t.value in HOSTILE_PROMPTS for t in at.text)
    for m in at.markdown:
        assert "<script" not in m.value and "](javascript" not in m.value
    bodies = "".join(h.proto.body for h in at.get("html"))
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in bodies or "&lt;img" in bodies


@pytest.fixture
def awkward(tmp_path) -> Path:
    return tmp_path


def test_empty_runs_folder(monkeypatch, awkward):
    at = _app(monkeypatch, awkward).run()
    assert not at.exception
    assert any("No recorded runs" in i.value for i in at.info)
    for page in PAGES:
        _open(at, page)


def _manifest(path: Path, status: str) -> None:
    path.mkdir(parents=True)
    (path / MANIFEST).write_text(
        json.dumps({"schema_version": SCHEMA_VERSION, "status": status, "rules": {"ppo": {"low": 0.2, "high": 0.2}}})
    )


def _every_page_says(at: AppTest, note: str) -> None:
    """Every page renders, and every page about the chosen run shows `note` in an info box."""
    for page in PAGES:
        at = _open(at, page)
        if page != "views/compare.py":
            assert any(note in i.value for i in at.info), page


def test_empty_run(monkeypatch, awkward):
    _manifest(awkward / "empty", "running")
    _every_page_says(_app(monkeypatch, awkward).run(), "no token rows yet")


def test_run_still_being_written(monkeypatch, awkward):
    import fcntl
    import os

    run = write_synthetic_run(
        awkward / "live", steps=2, samples_per_step=8, seq_len=16, status="running", rows_per_part=40
    )
    fd = os.open(run / ".rank=0.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # its writer, alive (without it: a writer that died, tests/test_dashboard_live.py)
    try:
        _every_page_says(_app(monkeypatch, awkward).run(), "still being written")
    finally:
        os.close(fd)


def test_corrupt_part_file_is_reported_and_skipped(monkeypatch, awkward):
    run = write_synthetic_run(awkward / "corrupt", steps=4, samples_per_step=8, seq_len=16, rows_per_part=100)
    part = sorted((run / "tokens").glob("rank=*/part-*.parquet"))[1]
    part.write_bytes(part.read_bytes()[:200])
    at = _app(monkeypatch, awkward).run()
    for page in PAGES:
        at = _open(at, page)
        assert any(part.name in w.value.replace("\\", "") and "skipping" in w.value for w in at.warning)


# ---------------------------------------------------------------- the launcher


def test_cli_parses_dashboard_flags(monkeypatch, tmp_path):
    calls = []

    class Done:
        def __init__(self, cmd, env):
            calls.append((cmd, env))

        def wait(self):
            return 0

    monkeypatch.setattr(dashboard.subprocess, "Popen", Done)
    assert cli.main(["dashboard", str(tmp_path), "--port", "8765"]) == 0
    cmd, env = calls[0]
    assert cmd[:4] == [sys.executable, "-m", "trustlens.dashboard", "run"] and Path(cmd[4]) == ENTRY
    flags = dict(zip(cmd[5::2], cmd[6::2], strict=True))
    assert flags["--server.port"] == "8765"
    assert flags["--server.address"] == "127.0.0.1"
    assert flags["--server.headless"] == "true"
    assert env[dashboard.RUNS_ENV] == str(tmp_path.resolve())
    # no argument: the shipped sample run
    sample = tmp_path / "sample_run"
    monkeypatch.setattr(dashboard, "default_runs", lambda: sample)
    assert cli.main(["dashboard"]) == 2  # not there yet
    sample.mkdir()
    assert cli.main(["dashboard"]) == 0
    assert calls[-1][1][dashboard.RUNS_ENV] == str(sample.resolve())
    assert dict(zip(calls[-1][0][5::2], calls[-1][0][6::2], strict=True))["--server.port"] == "8501"


def test_launch_rejects_bad_arguments(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match=r"runs folder '.*nowhere' does not exist"):
        dashboard.launch(tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"port must be an integer in \[1, 65535\], got 0"):
        dashboard.launch(tmp_path, port=0)
    assert cli.main(["dashboard", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_wheel_carries_the_app_and_the_shipped_data(tmp_path):
    root = APP.parent
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            str(root),
            "-w",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("trustlens-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = [*APP.rglob("*.py"), APP / "icon.png"]
    expected = {f"share/trustlens/app/{p.relative_to(APP).as_posix()}" for p in shipped}
    data = root / "data"
    expected |= {
        f"share/trustlens/data/{p.relative_to(data).as_posix()}"
        for p in data.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(data).parts)
    }
    installed = {n.split(".data/data/", 1)[1] for n in names if ".data/data/share/trustlens/" in n}
    assert expected == installed


def test_app_is_found_in_an_installed_prefix(monkeypatch, tmp_path):
    installed = tmp_path / "share" / "trustlens" / "app"
    (installed / "views").mkdir(parents=True)
    (installed / dashboard.ENTRY).write_text("")
    monkeypatch.setattr(dashboard, "_SOURCE_APP", tmp_path / "no_checkout" / "app")
    monkeypatch.setattr(dashboard, "_INSTALLED_APP", installed)
    assert dashboard.app_dir() == installed
    monkeypatch.setattr(dashboard, "_INSTALLED_APP", tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="dashboard app not found"):
        dashboard.app_dir()


def test_no_argument_opens_the_shipped_sample_run(monkeypatch):
    try:
        sample = dashboard.default_runs()
    except FileNotFoundError:
        sample = None
    if sample is None or not sample.is_dir():
        pytest.skip("the sample run is not shipped in data/sample_run yet")
    monkeypatch.delenv(dashboard.RUNS_ENV, raising=False)
    at = AppTest.from_file(str(ENTRY), default_timeout=120).run()
    assert not at.exception and not at.error
    assert at.sidebar.selectbox(key="tl_run").options
    for page in PAGES:
        _open(at, page)


# ---------------------------------------------------------------- pieces of the app's modules


@pytest.fixture
def app_module(monkeypatch):
    """Import a module of the app's folder by name, as the app imports its sibling modules."""
    monkeypatch.syspath_prepend(str(APP))
    return importlib.import_module


def test_tables_show_whitespace(app_module):
    import polars as pl

    df = pl.DataFrame({"token": [" the", "\t", "\n", "a b", None], "x": [1, 2, 3, 4, 5]})
    df = df.with_columns(pl.col("token").cast(pl.Categorical))
    assert app_module("safe_display").shown(df)["token"].tolist()[:4] == ["␣the", "⇥", "↵", "a␣b"]


def test_csv_download_neutralises_formulas(app_module):
    import polars as pl

    cells = ['=HYPERLINK("http://x")', "+1", "-2", "@SUM(A1)", "\tx", "\rx", "plain", None]
    df = pl.DataFrame({"token": cells, "n": list(range(8))}).with_columns(pl.col("token").cast(pl.Categorical))
    out = app_module("safe_display").csv_safe(df)
    assert out["token"].to_list() == ["'" + c for c in cells[:6]] + ["plain", None]
    assert out["n"].to_list() == list(range(8))  # numbers stay numbers
    text = out.write_csv()
    assert "\n=" not in text and ",=" not in text


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("localhost:8501", True),
        ("127.0.0.1:8501", True),
        ("[::1]:8501", True),
        ("app.localhost", True),
        ("10.0.0.5:8501", True),  # the configured address
        ("evil.example:8501", False),
        ("127.0.0.1.evil.example", False),
        ("", False),
        (None, True),  # no HTTP request at all (AppTest)
    ],
)
def test_host_header_check(app_module, host, allowed):
    assert app_module("host_check").host_allowed(host, ("10.0.0.5", None)) is allowed


def test_ppo_vs_dppo_decides_unrecorded_and_custom_rules(monkeypatch, runs):
    at = _open(_pick_run(_app(monkeypatch, runs).run(), "e_custom"), "views/ppo_vs_dppo.py")
    options = at.selectbox(key="pv_b").options
    assert "token · my_tv_rule" in options and any(o.startswith("token · dppo_binary_kl (decided") for o in options)
    at.selectbox(key="pv_a").set_value("my_tv_rule").run()
    at.selectbox(key="pv_b").set_value("dppo_binary_tv").run()  # not recorded: decided on the columns
    assert not at.exception and not at.error, [e.value for e in at.error]
    # the custom rule is dppo_binary_tv at its defaults: the two agree on every token
    assert any(m.label == "Agreement" and m.value == "100 %" for m in at.metric)


def test_mismatch_tiles_start_with_a_non_negative_kl(monkeypatch, runs):
    at = _open(_pick_run(_app(monkeypatch, runs).run(), "a_collapse"), "views/mismatch.py")
    first, k1 = at.metric[0], at.metric[1]
    # each tile names its scope: the last step's value (the run has steps 0–7)
    assert first.label == "k3\\_kl · step 7" and float(first.value) >= 0
    assert first.delta.startswith("trend ") and " → " in first.delta  # the trend's first and last value
    # the estimators that can be negative say so on the tile
    assert k1.label.startswith("mismatch\\_kl") and "K1 estimate" in k1.label and "can be" in k1.label


def test_numbers_show_infinity(app_module):
    number = app_module("safe_display").number
    assert number(float("inf")) == "∞" and number(float("-inf")) == "−∞"
    assert number(0.123456) == "0.1235" and number(None) == "n/a"


def _record_step(rec, step: int, g, shape: tuple[int, int], pi_noise: float = 0.0) -> None:
    """One step of random responses of `shape` (B, T): μ = π_old uniform in log space over
    [−3, 0], π = μ plus Gaussian noise of scale `pi_noise` (capped at log 1), one advantage per
    sequence."""
    import torch

    mu = -3 * torch.rand(*shape, generator=g)
    token_ids = torch.randint(0, 30, shape, generator=g)
    pi = (mu + pi_noise * torch.randn(*shape, generator=g)).clamp(max=0) if pi_noise else mu
    rec.record(
        step,
        token_ids=token_ids,
        response_mask=torch.ones(*shape),
        pi_logp=pi,
        mu_logp=mu,
        old_logp=mu,
        advantages=torch.randn(shape[0], generator=g),
    )


def test_sampled_run_says_so_on_every_page(monkeypatch, tmp_path):
    import torch

    from trustlens import Keep, TokenRecorder

    g = torch.Generator().manual_seed(0)
    with TokenRecorder(tmp_path / "sampled", rules=["ppo", "dppo_binary_tv"], keep=Keep(rate=0.1)) as rec:
        for step in range(4):
            _record_step(rec, step, g, (8, 12), pi_noise=0.3)
            rec.log_metrics(step, {"reward/mean": 0.5, "log_ppl_diff": 0.01 * step})  # the trainer's exact value
            if step in (0, 3):  # held-out evaluations, as the built-in trainer logs them
                rec.log_metrics(step, {"eval/accuracy": 0.4 if step == 0 else 0.55})
            rec.log_samples(step, rewards=[1.0] * 8, lengths=[12] * 8)
    at = _app(monkeypatch, tmp_path).run()
    for page in PAGES:
        at = _open(at, page)
        assert not at.error, [e.value for e in at.error]
        if page != "views/compare.py":
            assert any("Sampled run" in i.value and "0.1 share" in i.value for i in at.info), page
            assert any("are exact, from the run's aggregates" in i.value for i in at.info), page
        if page == "views/overview.py":  # every token of the run, not the kept rows
            assert _tile(at, "Tokens").value == f"{4 * 8 * 12:,}"
            # every response of the run, from its samples table, not those with a kept row
            assert _tile(at, "Samples").value == f"{4 * 8:,}"
            accuracy = _tile(at, "Accuracy")
            assert (accuracy.value, accuracy.delta) == ("0.550", "+0.150")
        if page == "views/ppo_vs_dppo.py":  # every A ≠ 0 token (no advantage is 0 here), from the aggregates
            assert next(m for m in at.metric if m.label == "Tokens compared").value == f"{4 * 8 * 12:,}"
            # the bucket bars and the confusion matrix have no exact form here: their titles say so
            titles = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]
            estimates = [t for t in titles if t.endswith("(estimate)")]
            assert [t.split(" (")[0] for t in estimates] == [
                "Blocked fraction by μ bucket",
                "Blocked by row rule, not by column rule",
            ]
        if page == "views/mismatch.py":  # exact token-level tiles only: no sequence-level estimate
            labels = [n.replace("\\_", "_") for n in _tile_names(at)]
            assert "prob_diff_mean" in labels and "log_ppl_abs_diff" not in labels
            # the table's sequence-level columns: the logged log_ppl_diff, the others empty, as captioned
            table = next(d.value for d in at.dataframe if "log_ppl_diff" in d.value.columns)
            assert table["log_ppl_diff"].tolist() == pytest.approx([0.0, 0.01, 0.02, 0.03])
            assert table["log_ppl_abs_diff"].isna().all() and table["chi2_seq"].isna().all()
            assert any("empty here: log_ppl_abs_diff, chi2_seq, not logged" in c.value for c in at.caption)
        if page == "views/token_inspector.py":  # the response: its kept tokens, the others marked
            (line,) = [m.value for m in at.markdown if m.value.startswith("**Response**")]
            kept = int(re.match(r"\*\*Response\*\* · (\d+) of its 12 tokens kept", line).group(1))
            drawn = next(h.proto.body for h in at.get("html") if "title=" in h.proto.body and "#" in h.proto.body)
            assert kept < 12 and "not recorded (a sampled run keeps only some tokens)" in drawn
    # under a token filter only the kept rows can be counted, and the tile says so
    at = _open(at, "views/overview.py")
    at.sidebar.selectbox(key="tl_sign").set_value("neg").run()
    assert "Samples" not in _tile_names(at)
    assert 0 < int(_tile(at, "Samples with kept rows").value) <= 32
    at = _open(at, "views/mismatch.py")  # no sequence-level value from the kept rows, logged or not
    table = next(d.value for d in at.dataframe if "log_ppl_diff" in d.value.columns)
    assert table[["log_ppl_diff", "log_ppl_abs_diff", "chi2_seq"]].isna().all().all()
    assert any("Under a token filter every column is estimated" in c.value for c in at.caption)
    at = _open(at, "views/ppo_vs_dppo.py")
    assert "Tokens compared (estimate)" in [m.label for m in at.metric]


def test_compare_over_seeds_and_a_copied_run(monkeypatch, tmp_path):
    """Runs of one setting on two seeds give the over-seeds table; a copied run (the same rule on
    the same seed twice) is named in an error instead of counting its seed twice."""
    import shutil

    for seed in (1, 2):
        write_synthetic_run(tmp_path / "two" / f"ppo-{seed}", **SIZES, rules=("ppo",), active_rule="ppo", seed=seed)
    at = _open(_app(monkeypatch, tmp_path / "two").run(), "views/compare.py")
    assert not at.exception and not at.error
    # each run's story in one line, then the group (escaped markdown)
    assert [m.value for m in at.markdown] == [
        "**ppo\\-1**: no warning or critical alert · no collapse",
        "**ppo\\-2**: no warning or critical alert · no collapse",
        "Settings group 1\\: 2 runs\\, 1 rules",
    ]
    shutil.copytree(tmp_path / "two", tmp_path / "copied")
    shutil.copytree(tmp_path / "two" / "ppo-1", tmp_path / "copied" / "ppo-1-copy")
    at = _open(_app(monkeypatch, tmp_path / "copied").run(), "views/compare.py")
    assert not at.exception
    assert any("Settings group 1 is not shown" in e.value and "ppo\\-1\\-copy" in e.value for e in at.error)
    # over the picked runs only: with the copy and its original not picked, no error about them
    at.multiselect(key="cr_runs").set_value([str(tmp_path / "copied" / "ppo-2")]).run()
    assert not at.exception and not at.error
    assert any("Over seeds: pick runs that share their settings" in c.value for c in at.caption)


def test_pages_keep_to_the_sidebar_steps_and_show_the_final_evaluation(monkeypatch, tmp_path):
    """A step range limits the Overview's and Collapse page's signals, alerts and evaluations; the
    whole run's range keeps the final evaluation, logged after the last training step."""
    import torch

    from trustlens import TokenRecorder

    g = torch.Generator().manual_seed(0)
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        for step in range(6):
            _record_step(rec, step, g, (4, 6))
            rec.log_metrics(step, {"eval/accuracy": 0.5} if step % 2 == 0 else {"reward/mean": 0.5})
        rec.log_metrics(6, {"eval/accuracy": 0.1})  # the final evaluation: no token rows at step 6
    at = _app(monkeypatch, tmp_path).run()
    at = _open(at, "views/collapse.py")
    assert at.dataframe[0].value["step"].max() == 6  # the per-step signals hold the final evaluation
    at = _open(at, "views/overview.py")
    assert _tile(at, "Accuracy").value == "0.100"
    at.sidebar.slider(key="tl_steps").set_value((1, 3)).run()
    assert _tile(at, "Accuracy").value == "0.500"  # steps 2 only
    at = _open(at, "views/collapse.py")
    assert at.dataframe[0].value["step"].to_list() == [1, 2, 3]


def test_mismatch_page_says_when_no_token_matches_the_filters(monkeypatch, runs):
    at = _open(_pick_run(_app(monkeypatch, runs).run(), "a_collapse"), "views/mismatch.py")
    at.sidebar.text_input(key="tl_text").input("zzzz").run()
    assert not at.exception
    assert [w.value for w in at.warning] == ["No token matches the sidebar filters."]
    assert not any("no token rows" in i.value for i in at.info)


def test_overview_says_a_reweighting_rule_never_blocks(monkeypatch, tmp_path):
    write_synthetic_run(tmp_path / "pg_is", **SIZES, rules=("ppo", "pg_is"), active_rule="pg_is", seed=1)
    at = _open(_app(monkeypatch, tmp_path).run(), "views/overview.py")
    tile = _tile(at, "Blocked by pg\\_is")
    assert tile.value == "never"


def test_a_trl_run_says_what_a_step_is(monkeypatch, tmp_path):
    run = write_synthetic_run(tmp_path / "trl", **SIZES, rules=RULES, seed=2)
    manifest = json.loads((run / "run.json").read_text())
    manifest["config"] = {"source": "trl.GRPOTrainer", "steps_per_generation": 2, "num_iterations": 3}
    (run / "run.json").write_text(json.dumps(manifest))
    at = _open(_app(monkeypatch, tmp_path).run(), "views/overview.py")
    assert "a step here is one generation (one rollout batch), not one optimizer step" in _page_text(at)
    assert "its updates (6 micro-batch passes per generation" in _page_text(at)


def test_tile_numbers_are_short_with_no_si_prefix(app_module):
    tiles = app_module("tiles")
    assert [tiles.count(n) for n in (384, 9_999, 32_000, 307_200, 480_655, 1_234_567)] == [
        "384",
        "9,999",
        "32k",
        "307k",
        "481k",
        "1.23M",
    ]
    assert [tiles.decimal(v) for v in (0.0, 0.2194, 1.6e-4, -2.3e-6, 12345.0, float("inf"), None)] == [
        "0",
        "0.219",
        "1.6e-4",
        "-2.3e-6",
        "1.23e4",
        "∞",
        "n/a",
    ]
    assert [tiles.percent(f) for f in (0.022, 0.75, 0.000213, None)] == ["2.2 %", "75 %", "0.0213 %", "n/a"]
    assert tiles.noise_to_zero(1.8e-15) == 0.0 and tiles.noise_to_zero(2e-9) == 2e-9


def test_overview_tiles_cover_the_run_not_the_last_step(monkeypatch, tmp_path):
    # the block rate and the A = 0 share are over every step shown (token-weighted), and say so
    write_synthetic_run(tmp_path / "r", **SIZES, rules=RULES, seed=4)
    at = _open(_app(monkeypatch, tmp_path).run(), "views/overview.py")
    from trustlens.analysis import step_summary
    from trustlens.run import load_run

    summary = step_summary(load_run(tmp_path / "r"))
    live = summary["tokens"] * (1 - summary["zero_adv_frac"])
    rule = load_run(tmp_path / "r").active_rule or RULES[0]
    blocked = (summary[f"blocked_{rule}"] * live).sum() / live.sum()
    zero = (summary["zero_adv_frac"] * summary["tokens"]).sum() / summary["tokens"].sum()
    tile = next(m for m in at.metric if m.label.startswith("Blocked by"))
    assert tile.label.endswith(" · run") and tile.value == f"{100 * blocked:.3g} %"
    assert _tile(at, "A = 0 tokens").value == f"{100 * zero:.3g} %"
    assert _tile(at, "Reward").label == f"Reward · step {summary['step'][-1]}"


def test_block_reasons_name_the_quantity_and_the_threshold(app_module):
    reasons = app_module("token_reasons").block_reasons
    tokens = pl.DataFrame(
        {
            "pos": [0, 1, 2],
            "token": ["a", "b", "c"],
            "advantage": [1.0, -1.0, 1.0],
            "ratio": [1.5, 0.5, 1.1],
            "binary_tv": [0.3, 0.2, 0.01],
            "blocked_ppo": [True, True, False],
        }
    )
    ppo = {"measure": "ratio", "low": 0.2, "high": 0.2, "anchor": "mu"}
    assert reasons(tokens, "ppo", ppo, mu_recorded=True).rows() == [
        (0, "a", "A > 0", "ratio = 1.5 > 1.2"),
        (1, "b", "A < 0", "ratio = 0.5 < 0.8"),
    ]
    tv = {"measure": "binary_tv", "low": 0.1, "high": 0.1, "anchor": "mu"}
    assert reasons(tokens, "ppo", tv, mu_recorded=True)["why"].to_list() == [
        "binary_tv = 0.3 > 0.1",
        "binary_tv = 0.2 > 0.1",
    ]
    # run.json written before it kept the measure (the shipped sample runs): the registry's ppo
    legacy = {k: ppo[k] for k in ("low", "high", "anchor")}
    assert reasons(tokens, "ppo", legacy, mu_recorded=True)["why"].to_list() == [
        "ratio = 1.5 > 1.2",
        "ratio = 0.5 < 0.8",
    ]
    # anchored on π_old in a run with μ: the rows' ratio is against μ, not what the rule compares
    old = {**ppo, "anchor": "old"}
    assert reasons(tokens, "ppo", old, mu_recorded=True)["why"][0].startswith("ratio (not recorded")


def test_sequence_reasons_give_the_responses_ratio_and_band(app_module):
    reasons = app_module("token_reasons")
    tokens = pl.DataFrame(
        {
            "pos": [0, 1],
            "token": ["a", "b"],
            "advantage": [1.0, 1.0],
            "ratio": [1.5, 0.9],
            "seq_logratio_mu": [0.3, 0.3],
            "seq_logratio_old": [0.002, 0.002],
            "seq_tokens": [2, 2],
            "blocked_gspo": [True, True],
            "blocked_rs_seq": [False, False],
            "blocked_ppo": [True, False],
        }
    )
    from trustlens.rules import RULES

    specs = {r: RULES[r].manifest_entry() for r in ("gspo", "rs_seq", "ppo")}
    got = reasons.sequence_reasons(tokens, specs).rows()
    assert got == [
        ("gspo", "geometric mean of π/π_old over 2 tokens", "1.001", "[0.9997, 1.0004]", "blocks the whole response"),
        ("rs_seq", "product of π_old/μ over 2 tokens", "1.34716", "[0.5, 2]", "passes"),
    ]
    assert reasons.block_reasons(tokens, "gspo", specs["gspo"], mu_recorded=True)["why"][0].startswith(
        "its whole response is blocked"
    )
    groups = app_module("rule_groups")
    assert groups.by_level(["gspo", "ppo", "rs_seq", "icepop"], specs) == ["ppo", "icepop", "gspo", "rs_seq"]
    assert groups.by_level(["kl_cov", "gspo", "ppo"], specs) == ["ppo", "gspo", "kl_cov"]
    assert groups.level_label("clip_cov", {}) == "batch · clip_cov"
    assert groups.level_label("gspo", {}) == "sequence · gspo" and groups.level_label("ppo", specs) == "token · ppo"


def test_a_busy_dashboard_says_so_and_runs_the_page_in_turn(monkeypatch, app_module):
    """With RUNNING_AT_ONCE page runs computing, the next one shows the busy note and waits; it
    runs once a slot frees, and the note is removed."""
    import threading

    busy = app_module("busy")
    shown: list[str] = []

    class Note:
        def info(self, text: str, **_) -> None:
            shown.append(text)

        def empty(self) -> None:
            shown.append("(removed)")

    monkeypatch.setattr(busy.st, "empty", Note)
    for _ in range(busy.RUNNING_AT_ONCE):
        assert busy._slots.acquire(blocking=False)
    entered = threading.Event()

    def page() -> None:
        with busy.in_turn():
            entered.set()

    thread = threading.Thread(target=page)
    try:
        thread.start()
        while not shown:  # the note is up: the run waits
            thread.join(0.05)
        assert not entered.is_set() and busy.waiting() == 1
        assert shown[0].startswith(f"The dashboard is busy: {busy.RUNNING_AT_ONCE} pages are being computed and 1 wait")
    finally:
        busy._slots.release()
        thread.join(30)
        for _ in range(busy.RUNNING_AT_ONCE - 1):
            busy._slots.release()
    assert entered.is_set() and busy.waiting() == 0 and shown[-1] == "(removed)"
    with busy.in_turn():  # a free slot: no note
        pass
    assert shown.count("(removed)") == 1
