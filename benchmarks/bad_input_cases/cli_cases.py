"""The command line, in-process through trustlens.cli.main: bad flags of train, demo, compare,
claims, dashboard, export, report and doctor. A bad flag must exit 2 with one line naming it on
stderr and no traceback, before any training starts: the training function, the process pool and
the dashboard server are replaced by stand-ins that raise `WouldStart`, counted as silent for a
bad flag (it would have trained or served) and as accepted for a valid one."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from types import SimpleNamespace

from bad_input_cases import Case, Fixtures, bad, ok

A = "cli"


class WouldStart(Exception):
    """A training run or a server the command would start: `what` and its settings."""

    def __init__(self, what: str, settings: object = None) -> None:
        super().__init__(f"would start {what}")
        self.what, self.settings = what, settings


class Refused(ValueError):
    """The CLI exited 2 with its error on stderr (the message is that line)."""


@contextlib.contextmanager
def _stand_ins() -> Iterator[None]:
    import trustlens.dashboard as dashboard
    import trustlens.train.runsets as runsets
    import trustlens.train.trainer as trainer

    def train(cfg, out, **kw):
        raise WouldStart("training", cfg)

    def processes(todo, overwrite, jobs):
        raise WouldStart("training processes", [cfg for cfg, _ in todo])

    def popen(command, **kw):
        raise WouldStart("the dashboard server", command)

    saved = (trainer.train, runsets._train_in_processes, dashboard.subprocess)
    trainer.train, runsets._train_in_processes = train, processes
    dashboard.subprocess = SimpleNamespace(Popen=popen)  # type: ignore[assignment]
    try:
        yield
    finally:
        trainer.train, runsets._train_in_processes, dashboard.subprocess = saved


def run_cli(argv: list[str]) -> object:
    """Run `trustlens ARGV`: its exit status 0, a WouldStart it raised, or Refused (exit 2 with its
    one-line error; a traceback or another status is raised as RuntimeError)."""
    from trustlens.cli import main

    err = io.StringIO()
    with _stand_ins(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
        except WouldStart as started:
            return started
    text = err.getvalue()
    if code == 2 and "Traceback" not in text:
        raise Refused(text.strip().splitlines()[-1] if text.strip() else "(nothing on stderr)")
    if code == 0:
        return 0
    raise RuntimeError(f"exit status {code}: {text[-300:]}")


TRAIN_FLAGS = {
    "--steps": ["0", "-1", "1.5", "abc"],
    "--temperature": ["inf", "nan", "0", "-1"],
    "--lr": ["0", "-1e-5", "nan"],
    "--rule": ["dppo_binary_tvv", "PPO", ""],
    "--minibatches": ["1000", "0"],
    "--group-size": ["1", "0"],
    "--prompts-per-step": ["0"],
    "--topk": ["0", "-3"],
    "--logit-noise": ["nan", "-0.1"],
    "--tv-bound": ["1.5", "0"],
    "--low": ["-1", "nan"],
    "--high": ["inf"],
    "--loss-agg-mode": ["sum"],
    "--rollout-precision": ["fp16"],
    "--engine": ["bogus"],
    "--threads": ["0"],
    "--keep-rate": ["0", "2"],
    "--mirror": ["tensorbord"],
    "--sample-every": ["0"],
    "--eval-every": ["0"],
    "--max-new-tokens": ["0"],
    "--rollout-lag": ["-1"],
    "--partial-credit": ["1"],
    "--seed": ["1.5"],
    "--epochs": ["0"],
    "--weight-decay": ["-1"],
    "--grad-clip": ["0"],
    "--clip-ratio-c": ["0"],
    "--preset": ["bogus"],
}


def cases(fx: Fixtures) -> list[Case]:
    out: list[Case] = []
    for flag, values in TRAIN_FLAGS.items():
        word = flag.lstrip("-").replace("-", "_") if flag not in ("--preset",) else "preset"
        for value in values:
            argv = ["train", "--out", str(fx.fresh("train")), flag, value]
            out.append(bad(A, f"train {flag} {value!r}", lambda argv=argv: run_cli(argv), _flag_word(flag, word)))
    out += [
        bad(A, "train --out an existing run", lambda: run_cli(["train", "--out", str(fx.good)]), "--out"),
        bad(A, "train --out a file", lambda: run_cli(["train", "--out", str(fx.variants["a_file"])]), "--out"),
        bad(A, "train --out empty", lambda: run_cli(["train", "--out", ""]), "--out"),
        bad(
            A,
            "train --checkpoint missing",
            lambda: run_cli(["train", "--out", str(fx.fresh()), "--checkpoint", str(fx.root / "nope.pt")]),
            "nope",
        ),
        bad(A, "train an unknown flag", lambda: run_cli(["train", "--stpes", "3"]), "--stpes"),
        ok(
            A,
            "train --steps 3",
            lambda: run_cli(["train", "--out", str(fx.fresh()), "--steps", "3"]),
            lambda r: isinstance(r, WouldStart) and r.settings.steps == 3,
        ),
        ok(
            A,
            "train --temperature 1",
            lambda: run_cli(["train", "--out", str(fx.fresh()), "--temperature", "1"]),
            lambda r: isinstance(r, WouldStart) and r.settings.temperature == 1.0,
        ),
    ]
    for port in ["99999", "0", "-1", "http", "8501.5"]:
        out.append(
            bad(
                A,
                f"demo --port {port}",
                lambda port=port: run_cli(["demo", "--out", str(fx.fresh()), "--port", port]),
                "--port",
            )
        )
        out.append(
            bad(
                A,
                f"dashboard --port {port}",
                lambda port=port: run_cli(["dashboard", str(fx.runs), "--port", port]),
                "--port",
            )
        )
    out += [
        bad(A, "dashboard a missing folder", lambda: run_cli(["dashboard", str(fx.root / "nope")]), "nope"),
        bad(A, "dashboard a file", lambda: run_cli(["dashboard", str(fx.variants["a_file"])]), "a_file"),
        bad(A, "dashboard --host empty", lambda: run_cli(["dashboard", str(fx.runs), "--host", ""]), "--host"),
        ok(
            A,
            "dashboard a folder of runs",
            lambda: run_cli(["dashboard", str(fx.runs), "--port", "8600"]),
            lambda r: isinstance(r, WouldStart) and "8600" in r.settings,
        ),
        ok(
            A,
            "demo --no-dashboard",
            lambda: run_cli(["demo", "--out", str(fx.fresh()), "--no-dashboard", "--steps", "2"]),
            lambda r: isinstance(r, WouldStart) and r.settings.steps == 2,
        ),
    ]
    for name in ("compare", "claims"):
        for flag, value, word in [
            ("--rules", "ppo,ppo", "twice"),
            ("--rules", "", "rule"),
            ("--rules", "ppo,ppoo", "ppoo"),
            ("--seeds", "a,b", "--seeds"),
            ("--seeds", "", "--seeds"),
            ("--seeds", "1.5", "--seeds"),
            ("--jobs", "0", "jobs"),
            ("--jobs", "-2", "jobs"),
            ("--steps", "0", "steps"),
            ("--temperature", "nan", "temperature"),
        ]:
            argv = [name, "--out", str(fx.fresh(name)), flag, value]
            out.append(bad(A, f"{name} {flag} {value!r}", lambda argv=argv: run_cli(argv), word))
    out += [
        bad(
            A,
            "claims --no-train on an empty folder",
            lambda: run_cli(["claims", "--no-train", "--out", str(fx.variants["empty"])]),
            "run",
        ),
        bad(
            A,
            "claims --no-train on a missing folder",
            lambda: run_cli(["claims", "--no-train", "--out", str(fx.root / "nope")]),
            "nope",
        ),
        ok(
            A,
            "compare two rules",
            lambda: run_cli(
                ["compare", "--out", str(fx.fresh()), "--rules", "ppo,cispo", "--steps", "2", "--jobs", "2"]
            ),
            lambda r: isinstance(r, WouldStart) and len(r.settings) == 2,
        ),
    ]
    tb = str(fx.fresh("tb"))
    out += [
        bad(A, "export no run", lambda: run_cli(["export", "--to", "tensorboard", tb]), "RUN"),
        bad(
            A,
            "export a missing run",
            lambda: run_cli(["export", str(fx.root / "nope"), "--to", "tensorboard", tb]),
            "nope",
        ),
        bad(A, "export --to typo", lambda: run_cli(["export", str(fx.good), "--to", "tensorbord", tb]), "--to"),
        bad(
            A,
            "export --to tensorboard without LOGDIR",
            lambda: run_cli(["export", str(fx.good), "--to", "tensorboard"]),
            "--to",
        ),
        bad(
            A,
            "export --to tensorboard two dirs",
            lambda: run_cli(["export", str(fx.good), "--to", "tensorboard", tb, tb]),
            "--to",
        ),
        bad(
            A,
            "export --to tensorboard empty LOGDIR",
            lambda: run_cli(["export", str(fx.good), "--to", "tensorboard", ""]),
            "logdir",
        ),
        bad(A, "export a folder of runs", lambda: run_cli(["export", str(fx.runs), "--to", "tensorboard", tb]), "runs"),
        bad(A, "export without --to", lambda: run_cli(["export", str(fx.good)]), "--to"),
        ok(
            A,
            "export a run",
            lambda: run_cli(["export", str(fx.good), "--to", "tensorboard", str(fx.fresh("tb"))]),
            lambda r: r == 0,
        ),
        bad(
            A,
            "report a missing run",
            lambda: run_cli(["report", str(fx.root / "nope"), "-o", str(fx.fresh("r")) + ".html"]),
            "nope",
        ),
        bad(A, "report no run", lambda: run_cli(["report"]), "RUN"),
        bad(A, "report -o a folder", lambda: run_cli(["report", str(fx.good), "-o", str(fx.root)]), "folder"),
        bad(A, "report -o empty", lambda: run_cli(["report", str(fx.good), "-o", ""]), "out"),
        bad(
            A,
            "report a foreign folder",
            lambda: run_cli(["report", str(fx.variants["foreign"]), "-o", str(fx.fresh("r")) + ".html"]),
            "foreign",
        ),
        ok(
            A,
            "report a run",
            lambda: run_cli(["report", str(fx.good), "-o", str(fx.fresh("r")) + ".html"]),
            lambda r: r == 0,
        ),
        bad(A, "doctor a missing run", lambda: run_cli(["doctor", str(fx.root / "nope")]), "nope"),
        bad(A, "doctor a file", lambda: run_cli(["doctor", str(fx.variants["a_file"])]), "a_file"),
        bad(A, "doctor a folder of runs", lambda: run_cli(["doctor", str(fx.runs)]), "runs"),
        bad(A, "doctor two runs", lambda: run_cli(["doctor", str(fx.good), str(fx.good)]), "unrecognized"),
        bad(A, "doctor no run", lambda: run_cli(["doctor"]), "RUN"),
        bad(A, "doctor an empty path", lambda: run_cli(["doctor", ""]), "path"),
        ok(A, "doctor a run", lambda: run_cli(["doctor", str(fx.good), "--json"]), lambda r: r == 0),
        bad(A, "an unknown command", lambda: run_cli(["trian"]), "trian"),
    ]
    return out


def _flag_word(flag: str, word: str) -> str:
    """The flag's name as either the flag (--tv-bound) or its setting (tv_bound) may be named:
    the longest word of the setting's name, which is in both (argparse's errors, the choices
    checked while parsing included, name the flag, TrainConfig's the setting); the CLI errors are
    matched on it."""
    return max(word.split("_"), key=len)
