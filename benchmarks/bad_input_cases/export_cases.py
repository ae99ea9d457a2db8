"""Exports and reports: trustlens.export and trustlens.report given no runs, paths where runs are
expected, and bad destinations."""

from __future__ import annotations

import polars as pl

from bad_input_cases import Case, Fixtures, bad, ok
from trustlens import export, load_run, report

A = "export/report"


def cases(fx: Fixtures) -> list[Case]:
    run = load_run(fx.good)
    out: list[Case] = []
    for label, value in [
        ("None", None),
        ("a number", 3),
        ("a DataFrame", pl.DataFrame()),
        ("the token rows", run.tokens),
    ]:
        out += [
            bad(A, f"step_scalars {label}", lambda value=value: export.step_scalars(value), "run"),
            bad(
                A,
                f"export_run {label}",
                lambda value=value: export.export_run(value, _Sink()),
                "run",
            ),
            bad(A, f"driving_tokens {label}", lambda value=value: export.driving_tokens(value, pl.DataFrame()), "run"),
            bad(A, f"build_report runs {label}", lambda value=value: report.build_report(value), "runs"),
        ]
    out += [
        bad(A, "token_scalars None", lambda: export.token_scalars(None), "tokens"),
        bad(A, "token_scalars a Run", lambda: export.token_scalars(3), "tokens"),
        bad(A, "alert_text None", lambda: export.alert_text(None), "alerts"),
        bad(A, "alert_text a list", lambda: export.alert_text([1]), "alerts"),
        bad(A, "driving_tokens alerts None", lambda: export.driving_tokens(run, None), "alerts"),
        bad(A, "make_mirror unknown name", lambda: export.make_mirror("tensorbord"), "tensorbord"),
        bad(A, "make_mirror a number", lambda: export.make_mirror(3), "mirror"),
        bad(A, "make_mirror None", lambda: export.make_mirror(None), "mirror"),
        bad(A, "StepMirror a string", lambda: export.StepMirror("tensorboard"), "sink"),
        bad(A, "TensorBoardSink empty logdir", lambda: export.TensorBoardSink(""), "logdir"),
        bad(A, "TensorBoardSink None", lambda: export.TensorBoardSink(None), "logdir"),
        bad(A, "export_tensorboard empty logdir", lambda: export.export_tensorboard([run], ""), "logdir"),
        bad(
            A,
            "export_tensorboard a path string as runs",
            lambda: export.export_tensorboard(str(fx.good), fx.fresh("tb")),
            "runs",
        ),
        bad(A, "export_tensorboard no runs", lambda: export.export_tensorboard([], fx.fresh("tb")), "runs"),
        bad(
            A,
            "export_tensorboard a missing run",
            lambda: export.export_tensorboard([str(fx.root / "nope")], fx.fresh("tb")),
            "nope",
        ),
        bad(A, "export_wandb project a number", lambda: export.export_wandb([run], project=3), "project"),
        bad(A, "build_report no runs", lambda: report.build_report([]), "run"),
        bad(A, "build_report a missing run", lambda: report.build_report([str(fx.root / "nope")]), "nope"),
        bad(A, "build_report title None", lambda: report.build_report([run], title=None), "title"),
        bad(A, "build_report a path string", lambda: report.build_report(str(fx.good)), "runs"),
        bad(A, "write_report out empty", lambda: report.write_report([run], ""), "out"),
        bad(A, "write_report out None", lambda: report.write_report([run], None), "out"),
        bad(A, "write_report out a folder", lambda: report.write_report([run], fx.root), "folder"),
        ok(
            A,
            "write_report out in a missing folder",
            lambda: report.write_report([run], fx.root / "no" / "r.html"),
            lambda p: p.is_file(),
        ),
        ok(A, "step_scalars the run", lambda: export.step_scalars(run), lambda t: t["step"].n_unique() == 6),
        ok(
            A,
            "export_tensorboard a run",
            lambda: export.export_tensorboard([run], fx.fresh("tb")),
            lambda d: list(d.values()) == [6],
        ),
        ok(
            A,
            "build_report one run",
            lambda: report.build_report([run]),
            lambda html: html.startswith("<!") or "<html" in html[:500].lower(),
        ),
        ok(
            A,
            "build_report a path",
            lambda: report.build_report([str(fx.good)]),
            lambda html: "<html" in html[:500].lower(),
        ),
        ok(A, "alert_text no alerts", lambda: export.alert_text(pl.DataFrame()), lambda r: r == {}),
    ]
    return out


class _Sink:
    """A sink of export_run and of StepMirror that keeps nothing."""

    def log_step(self, step, scalars):
        pass

    def log_alerts(self, alerts):
        pass

    def flush(self):
        pass

    def close(self):
        pass
