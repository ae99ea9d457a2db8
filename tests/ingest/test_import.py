"""`trustlens import`: the logs of each kind, the frameworks' names, the round trip through
`trustlens export`, and bad input (issue 51)."""

import json
import math
import shutil
import struct
import warnings
from pathlib import Path

import polars as pl
import pytest
from ingest.logs import COLLAPSE_AT, trl_logs, verl_steps, write_trl_logs, write_verl_jsonl, write_verl_tensorboard

from trustlens import load_run
from trustlens.analysis.collapse import detect_collapse, step_signals
from trustlens.ingest import ImportWarning, import_log
from trustlens.ingest.events import EventFile, event_files

ROOT = Path(__file__).resolve().parents[2]
KEY = ["step", "end_step", "kind", "signal", "severity", "critical_step", "evidence_start_step", "evidence"]


@pytest.fixture(scope="module")
def verl_tb(tmp_path_factory):
    return write_verl_tensorboard(tmp_path_factory.mktemp("verl") / "tensorboard_log" / "gsm8k" / "grpo", verl_steps())


def _metrics(run) -> dict[tuple[int, str], float]:
    frame = run.metrics.collect()
    return {(s, n): v for s, n, v in zip(frame["step"], frame["name"], frame["value"], strict=True)}


def test_verl_tensorboard_gets_trustlens_names_and_the_metric_alerts(verl_tb, tmp_path):
    done = import_log(verl_tb, tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert done.framework == "verl" and run.manifest["framework"] == "verl"
    assert run.manifest["source"]["kind"] == "tensorboard" and run.status == "finished"
    values = _metrics(run)
    logged = dict(verl_steps())
    assert values[(5, "entropy/mean")] == pytest.approx(logged[5]["actor/entropy"], rel=1e-6)  # float32 in TB
    assert values[(10, "eval/accuracy")] == pytest.approx(logged[10]["val-core/openai/gsm8k/acc/mean@1"], rel=1e-6)
    assert values[(7, "critic/rewards/mean")] == pytest.approx(logged[7]["critic/rewards/mean"], rel=1e-6)  # kept
    assert (7, "actor/entropy") not in values
    assert len({n for _, n in values}) == 50
    alerts = detect_collapse(run)
    kinds = set(alerts["kind"])
    assert kinds == {
        "mismatch_growth",
        "entropy_collapse",
        "grad_norm_spike",
        "blocked_drift",
        "accuracy_drop",
        "reward_drop",
    }
    critical = alerts.filter(pl.col("severity") == "critical")
    assert set(critical["kind"]) == {"reward_drop", "accuracy_drop"}
    assert critical["step"].min() == COLLAPSE_AT and (critical["evidence"].list.len() > 0).all()
    assert alerts.filter(pl.col("kind") == "blocked_drift")["signal"].to_list() == ["blocked_ppo"]  # the clip fraction
    assert all(t == [] for t in alerts["tokens"].to_list())  # no token rows to point at


def test_verl_file_logger_equals_its_tensorboard(verl_tb, tmp_path):
    write_verl_jsonl(tmp_path / "gsm8k" / "grpo.jsonl", verl_steps())
    jsonl = import_log(tmp_path / "gsm8k" / "grpo.jsonl", tmp_path / "a")
    assert jsonl.log.kind == "verl-jsonl" and jsonl.framework == "verl"
    import_log(verl_tb, tmp_path / "b")
    a, b = (detect_collapse(load_run(tmp_path / x)) for x in "ab")
    assert a.select(KEY).equals(b.select(KEY))


def test_trl_trainer_state_and_tensorboard_get_the_mapped_names(tmp_path):
    state, tb = write_trl_logs(tmp_path / "trl", trl_logs())
    for src in (state, tb):
        done = import_log(src, tmp_path / f"run-{src.name}")
        assert done.framework == "trl"
        values = _metrics(load_run(done.path))
        assert values[(3, "reward/mean")] == pytest.approx(0.32, rel=1e-6)
        assert values[(3, "logp_abs_diff_mean")] == pytest.approx(0.02, rel=1e-6)
        assert values[(3, "clip_frac")] == pytest.approx(0.004, rel=1e-6)
        assert values[(3, "entropy/mean")] == pytest.approx(0.698, rel=1e-6)
        assert any(n.endswith("learning_rate") for _, n in values)  # not in the table: kept


def test_wandb_offline_run_and_exported_history(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="p", dir=str(tmp_path), config={})
    for step, data in verl_steps(30, filler=False):
        run.log({**data, "note": "text"}, step=step)
    run.finish()
    (offline,) = (tmp_path / "wandb").glob("offline-run-*")
    # (W&B offline may leave out the last step's row: the test reads what the file holds)
    with pytest.warns(ImportWarning, match=r"'note' holds (29|30) values that are not numbers"):
        done = import_log(offline, tmp_path / "run")
    assert done.log.kind == "wandb" and done.framework == "verl"
    values = _metrics(load_run(tmp_path / "run"))
    assert values[(4, "k3_kl")] == dict(verl_steps(30, filler=False))[4]["rollout_corr/k3_kl"]  # float64 in W&B
    # the same history exported to CSV
    rows = [{"_step": s, **d} for s, d in verl_steps(30, filler=False)]
    csv = tmp_path / "history.csv"
    names = list(rows[-1])
    csv.write_text(",".join(names) + "\n" + "\n".join(",".join(str(r.get(n, "")) for n in names) for r in rows) + "\n")
    import_log(csv, tmp_path / "csv")
    from_csv = _metrics(load_run(tmp_path / "csv"))
    assert {k: from_csv[k] for k in values} == pytest.approx(values) and len(values) >= len(from_csv) - 10
    (tmp_path / "history.json").write_text(json.dumps(rows))
    import_log(tmp_path / "history.json", tmp_path / "json")
    assert _metrics(load_run(tmp_path / "json")) == pytest.approx(from_csv)


def test_round_trip_through_export_gives_the_run_s_alerts(tmp_path):
    """A built-in run exported to TensorBoard and imported: the metric-based alerts of the
    original run (which has collapse alerts: accuracy_drop, reward_drop)."""
    from trustlens.export import export_tensorboard

    run = load_run(ROOT / "data" / "sample_run" / "pg_is")
    export_tensorboard([run], tmp_path / "tb")
    done = import_log(tmp_path / "tb" / run.name, tmp_path / "run")
    assert done.framework == "trustlens"
    imported = load_run(tmp_path / "run")
    assert imported.active_rule == run.active_rule and imported.manifest["planned_steps"] == run.manifest.get(
        "planned_steps"
    )
    original, back = detect_collapse(run), detect_collapse(imported)
    assert original.height >= 2
    assert back.select(KEY).equals(original.select(KEY))
    assert back["value"].to_list() == pytest.approx(original["value"].to_list(), rel=1e-5)
    assert back["baseline"].to_list() == pytest.approx(original["baseline"].to_list(), rel=1e-5)
    # every signal the detectors read came back (float32 in the event files)
    a, b = step_signals(run), step_signals(imported)
    for column in (
        "entropy",
        "k3_kl",
        "prob_diff_mean",
        "reward",
        "accuracy",
        "grad_norm",
        f"blocked_{run.active_rule}",
    ):
        x, y = a[column].to_list(), b[column].to_list()
        assert [v is None for v in x] == [v is None for v in y], column
        assert [v for v in y if v is not None] == pytest.approx([v for v in x if v is not None], rel=1e-5), column


# ---- bad input ----


def test_missing_and_empty_sources(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        import_log(tmp_path / "nope", tmp_path / "run")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no TensorBoard event files"):
        import_log(tmp_path / "empty", tmp_path / "run")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="not a log trustlens import reads"):
        import_log(tmp_path / "notes.txt", tmp_path / "run")


def test_a_corrupt_event_file_is_skipped_by_name_and_the_rest_imported(tmp_path):
    first = write_verl_tensorboard(tmp_path / "tb", verl_steps(20, filler=False))
    (good,) = event_files(first)
    bad = good.with_name(good.name + ".2")  # a second file of the same writer (a resumed run)
    data = bytearray(good.read_bytes())
    data[40:48] = b"\xff" * 8  # a frame's length (and its CRC) overwritten
    bad.write_bytes(bytes(data))
    with pytest.warns(ImportWarning, match=f"skipping corrupt event file {bad}"):
        done = import_log(tmp_path / "tb", tmp_path / "run")
    assert done.log.files == [good] and done.steps == 20


def test_a_frame_cut_short_is_read_once_complete(tmp_path):
    write_verl_tensorboard(tmp_path / "tb", verl_steps(3, filler=False))
    (path,) = event_files(tmp_path / "tb")
    whole = path.read_bytes()
    path.write_bytes(whole[:-10])  # the last frame still being written
    reader = EventFile(path)
    first = reader.read()
    path.write_bytes(whole)
    rest = reader.read()
    assert len(rest.values) == 1 and first.values + rest.values == EventFile(path).read().values


def test_two_runs_in_one_dir_are_refused_naming_both(tmp_path):
    write_verl_tensorboard(tmp_path / "logs" / "run_a", verl_steps(3, filler=False))
    write_verl_tensorboard(tmp_path / "logs" / "run_b", verl_steps(3, filler=False))
    with pytest.raises(ValueError, match=r"holds the event files of 2 runs \(run_a, run_b\)"):
        import_log(tmp_path / "logs", tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_non_numeric_values_are_left_out_with_a_warning(tmp_path):
    path = tmp_path / "m.jsonl"
    rows = [
        {"step": s, "data": {"actor/entropy": 0.5, "critic/score/mean": [1, 2] if s == 2 else 0.1}} for s in range(4)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.warns(
        ImportWarning, match=r"'critic/score/mean' holds 1 values that are not numbers \(e.g. '\[1, 2\]'\)"
    ):
        import_log(path, tmp_path / "run")
    values = _metrics(load_run(tmp_path / "run"))
    assert (2, "reward/mean") not in values and values[(3, "reward/mean")] == 0.1 and len(values) == 7


def test_steps_out_of_order_or_repeated_keep_the_last_value(tmp_path):
    path = tmp_path / "m.jsonl"
    steps = [0, 1, 2, 1, 3]  # a resumed run logs step 1 again
    path.write_text(
        "".join(json.dumps({"step": s, "data": {"actor/entropy": float(n)}}) + "\n" for n, s in enumerate(steps))
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import_log(path, tmp_path / "run")
    text = [str(w.message) for w in caught]
    assert any(
        "logged steps out of order (e.g. 'actor/entropy': step 1 after step 2): sorted by step" in t for t in text
    )
    assert any(
        "1 (step, metric) pairs logged more than once" in t and "the value logged last is kept" in t for t in text
    )
    frame = load_run(tmp_path / "run").metrics.collect()
    assert frame["step"].to_list() == [0, 1, 2, 3] and frame["value"].to_list() == [0.0, 3.0, 2.0, 4.0]


def test_the_out_run_is_never_overwritten_silently(verl_tb, tmp_path):
    import_log(verl_tb, tmp_path / "run")
    with pytest.raises(FileExistsError, match="already holds a run"):
        import_log(verl_tb, tmp_path / "run")
    import_log(verl_tb, tmp_path / "run", overwrite=True)


def test_framework_flag_when_the_names_do_not_tell(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"step": s, "train/reward": 0.1 * s}) + "\n" for s in range(3)))
    assert import_log(path, tmp_path / "a").framework is None  # TRL, NeMo-RL and OpenRLHF all log train/reward
    assert (1, "train/reward") in _metrics(load_run(tmp_path / "a"))
    assert import_log(path, tmp_path / "b", framework="nemo-rl").framework == "nemo-rl"
    assert (1, "reward/mean") in _metrics(load_run(tmp_path / "b"))
    with pytest.raises(ValueError, match="--framework must be one of"):
        import_log(path, tmp_path / "c", framework="verll")


def test_tf2_tensor_scalars_are_read(tmp_path):
    """TF2's tf.summary.scalar stores a float tensor (plugin "scalars"), not simple_value."""
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2

    from trustlens.ingest.events import masked_crc32c

    (tmp_path / "tb").mkdir()
    path = tmp_path / "tb" / "events.out.tfevents.1.host"
    with open(path, "wb") as f:
        for step in range(3):
            value = summary_pb2.Summary.Value(
                tag="actor/entropy", tensor=tensor_pb2.TensorProto(dtype=1, float_val=[0.5 + step])
            )
            value.metadata.plugin_data.plugin_name = "scalars"
            data = event_pb2.Event(
                step=step, wall_time=1.0, summary=summary_pb2.Summary(value=[value])
            ).SerializeToString()
            header = struct.pack("<Q", len(data))
            f.write(header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data)))
    import_log(tmp_path / "tb", tmp_path / "run", framework="verl")
    assert _metrics(load_run(tmp_path / "run")) == {(s, "entropy/mean"): 0.5 + s for s in range(3)}
    assert math.isfinite(0.5)
    shutil.rmtree(tmp_path / "run")


def test_the_command_prints_the_mapping_and_alerts_and_progress_on_stderr(verl_tb, tmp_path, capsys):
    from trustlens.cli import main

    assert main(["import", str(verl_tb), "--out", str(tmp_path / "run")]) == 0
    captured = capsys.readouterr()
    assert "trustlens import: read" in captured.err and "MiB" in captured.err  # progress
    assert "(framework verl)" in captured.out and "actor/entropy → entropy/mean" in captured.out
    assert "CRITICAL reward_drop" in captured.out and "6 alerts (2 critical)" in captured.out
    assert main(["import", str(verl_tb), "--out", str(tmp_path / "run")]) == 2  # not overwritten
    assert "already holds a run" in capsys.readouterr().err


def test_import_into_an_object_store(s3, verl_tb):
    from s3_server import BUCKET

    done = import_log(verl_tb, f"s3://{BUCKET}/runs/imported")
    run = load_run(f"s3://{BUCKET}/runs/imported")
    assert str(done.path) == str(run.path) and run.manifest["framework"] == "verl"
    assert set(detect_collapse(run)["kind"]) >= {"reward_drop", "accuracy_drop"}
