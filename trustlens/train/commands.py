"""The `trustlens train`, `compare`, `claims`, `demo` and `make-sample` commands: their flags and
`train`; compare and claims run in `trustlens.train.runsets`, demo and make-sample in
`trustlens.train.sample`, each run through `trustlens.train.runner`.

    trustlens train --rule dppo_binary_tv --steps 60 --out runs/dppo --seed 0
    trustlens compare --rules ppo,dppo_binary_tv,pg_is --steps 60 --out runs/
    trustlens demo                      # the default run, then the dashboard on it
    trustlens make-sample               # regenerate the shipped sample runs, data/sample_run
    trustlens claims --seeds 0,1,2      # the paper's claims C1–C6 measured: runs/claims/claims.md

Data parallel on CPU: `torchrun --nproc_per_node 2 -m trustlens.cli train ...` (gloo); each rank
rolls out its share of the prompts and records its own shard of the run.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable
from pathlib import Path

from trustlens.core.argument_checks import EXIT_ALERT_STOP, STOP_ON, check_choice, choice_arg, mirror_arg, port_arg
from trustlens.train.config import LOSS_AGG_MODES_HELP, MODEL_KINDS, PRESETS, field_defaults
from trustlens.train.defect_names import defects_help
from trustlens.train.runner import config, finish, is_main, print_inspect, run_one
from trustlens.train.runsets import CLAIM_RULES, claims_command, compare_command
from trustlens.train.sample import DEMO_SEED, demo_command, make_sample_command


def _rule_help() -> str:
    """The help of --rule: the registry's rules grouped by level (token, sequence, batch), each
    with its one-line `Rule.description`; one line each (`_LineHelpFormatter` keeps the breaks)."""
    from trustlens.rules import RULES

    lines = [
        "trust-region rule that gates the updates; every other rule is evaluated too (docs/rules.md) [dppo_binary_tv]"
    ]
    for level in dict.fromkeys(rule.level for rule in RULES.values()):
        lines.append(f"{level} rules:")
        lines += [f"  {rule.name}: {rule.description}" for rule in RULES.values() if rule.level == level]
    return "\n".join(lines).replace("%", "%%")  # argparse expands %(...)s in help


class _LineHelpFormatter(argparse.HelpFormatter):
    """argparse's help formatter, keeping the line breaks of a help text that has them (the --rule
    list): each line is wrapped on its own, an indented line's continuation two spaces deeper."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        if "\n" not in text:
            return super()._split_lines(text, width)
        wrapped: list[str] = []
        for line in text.splitlines():
            indent = line[: len(line) - len(line.lstrip())]
            wrapped += textwrap.wrap(line, width, subsequent_indent=indent + "  " if indent else "")
        return wrapped


def _rules() -> list[str]:
    from trustlens.rules import RULES

    return list(RULES)


def _engines() -> list[str]:
    from trustlens.train.defect_names import ENGINE_DEFECTS

    return list(ENGINE_DEFECTS)


def _precisions() -> list[str]:
    from trustlens.train.rollout import PRECISIONS

    return sorted(PRECISIONS)


def _loss_agg_modes() -> list[str]:
    from trustlens.rules.loss import LOSS_AGG_MODES

    return list(LOSS_AGG_MODES)


# (TrainConfig field, argparse type, help). The flag is --field-name; its default is the preset's.
_CONFIG_FLAGS: tuple[tuple[str, Callable[[str], object], str], ...] = (
    ("steps", int, "training steps; each is one rollout batch"),
    ("seed", int, "seed of the problems, the sampling and the minibatch order"),
    ("low", float, "the rule's threshold when A ≤ 0"),
    ("high", float, "the rule's threshold when A > 0"),
    ("tv_bound", float, "δ of every TV-bounded DPPO rule (binary and top-K TV) where --low/--high give none"),
    ("prompts_per_step", int, "problems per step, over all ranks"),
    ("group_size", int, "responses sampled per problem (GRPO group size G)"),
    ("minibatches", int, "optimizer updates per pass over a rollout batch"),
    ("epochs", int, "passes over each rollout batch"),
    ("lr", float, "AdamW learning rate"),
    ("warmup_steps", int, "learning-rate warm-up: linear from lr/N to lr over the first N steps (0 = none)"),
    ("weight_decay", float, "AdamW weight decay"),
    ("grad_clip", float, "max global gradient L2 norm"),
    ("clip_ratio_c", float, "cap C of the importance weight min(π/μ, C)"),
    ("loss_agg_mode", choice_arg(_loss_agg_modes), "loss aggregation over tokens: " + LOSS_AGG_MODES_HELP),
    ("temperature", float, "sampling temperature τ (μ and π both use logits / τ)"),
    ("max_new_tokens", int, "response length cap in tokens"),
    ("topk", int, "K of μ's recorded top-K distribution"),
    (
        "rollout_precision",
        choice_arg(_precisions),
        "rollout engine precision: bf16, fp32, fp32_exact (the trainer's numerics, bit-exact) or fp8 (W8A8 float8)",
    ),
    ("rollout_lag", int, "rollout engine lags the trainer by this many steps (asynchronous RL)"),
    ("logit_noise", float, "std of Gaussian noise on the rollout engine's logits"),
    (
        "engine",
        choice_arg(_engines),
        defects_help(),
    ),
    ("eval_every", int, "evaluate held-out accuracy every this many steps"),
    ("eval_size", int, "held-out problems per evaluation (0 = no evaluation)"),
    ("partial_credit", float, "reward share for right scratchpad steps when the final answer is wrong"),
    ("checkpoint", str, "warm-start checkpoint folder; 'random' starts from a random model"),
    (
        "model",
        choice_arg(lambda: MODEL_KINDS),
        "the policy and its shipped warm start: dense (Llama) or moe (Qwen3-MoE: 8 experts, top-2, the router's "
        "load-balancing loss in the training loss)",
    ),
    (
        "routing_split_every",
        int,
        "MoE: every this many steps a shadow forward under the engine's routing splits log π_old − log μ into a "
        "routing and a residual part (routing/* metrics; 0 = never)",
    ),
    ("threads", int, "torch CPU threads per process"),
    ("sample_every", int, "record prompts and responses every this many steps"),
    (
        "keep_rate",
        float,
        "sampled recording: every token that matters and this share of the rest, with exact aggregates",
    ),
    (
        "keep_rules",
        lambda text: _rule_list(text),
        "with --keep-rate: comma-separated rules whose blocked tokens are all kept too, for token-level views of "
        "them (the trained rule's always are; the others' are sampled at the rate, counted exactly)",
    ),
    ("mirror", mirror_arg, "stream each step's scalars live from rank 0: tensorboard:LOGDIR, wandb or wandb:PROJECT"),
    (
        "stop_on",
        choice_arg(lambda: STOP_ON),
        "stop after a live alert of this severity or above, keeping the last checkpoint from before it "
        "(RUN/checkpoints): critical, warning or never",
    ),
    (
        "checkpoint_every",
        int,
        "with --stop-on: a rolling checkpoint every this many steps (and one at each evaluation)",
    ),
    (
        "keep_checkpoints",
        int,
        "with --stop-on: rolling checkpoints kept, besides the one a stop would keep (at most this + 1 on disk)",
    ),
    (
        "flush_seconds",
        float,
        "the recorder writes rows older than this many seconds (the most a killed run loses); with --alerts or "
        "--stop-on each step's rows are also written at its end, and an alert at once",
    ),
)

# how --help shows the defaults that are not a value of their own
_SHOWN_DEFAULTS = {
    "checkpoint": "the shipped data/warmstart, data/warmstart_moe with --model moe",
    "low": "the rule's own",
    "high": "the rule's own",
    "tv_bound": "each rule's own (0.15)",
    "mirror": "none",
    "keep_rate": "every token",
    "keep_rules": "none",
}


def _train_flags(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (parser.epilog or "") + (
        f". Exit codes: 0 the run finished, 2 bad input, {EXIT_ALERT_STOP} --stop-on stopped it (run.json "
        "status stopped: `stopped` names the alert and the checkpoint kept)"
    )
    parser.add_argument("--rule", type=choice_arg(_rules), default="dppo_binary_tv", help=_rule_help())
    parser.add_argument("--out", type=Path, default=None, help="run directory (default: runs/<rule>)")
    parser.set_defaults(func=_train)


def _compare_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rules",
        type=_rule_list,
        default="ppo,dppo_binary_tv,pg_is",
        help="comma-separated rules, each trained into its own run [ppo,dppo_binary_tv,pg_is]",
    )
    parser.add_argument(
        "--seeds",
        type=_int_list,
        default="0",
        help="comma-separated seeds; several give OUT/<rule>-seed<S> runs [0]",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs"),
        help="parent directory: one run per rule and seed, and the table OUT/compare.csv [runs]",
    )
    _add_run_set_options(parser)
    parser.set_defaults(func=compare_command)


def _claims_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rules",
        type=_rule_list,
        default=",".join(CLAIM_RULES),
        help=f"rules trained, one run per seed each [{','.join(CLAIM_RULES)}]",
    )
    parser.add_argument("--seeds", type=_int_list, default="0,1,2", help="comma-separated seeds [0,1,2]")
    parser.add_argument(
        "--out", type=Path, default=Path("runs/claims"), help="runs, figures and claims.md go here [runs/claims]"
    )
    _add_run_set_options(parser)
    parser.add_argument(
        "--no-train",
        action="store_true",
        help="only measure the finished runs already in OUT that share their settings apart from rule and "
        "seed: those of --preset and the training flags if given, else the largest such set (the others "
        "are named and left out)",
    )
    parser.set_defaults(func=claims_command)


def _demo_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rule", type=choice_arg(_rules), default="dppo_binary_tv", help=_rule_help())
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="run directory (default: runs/demo, replacing an earlier demo run); the dashboard opens on its "
        "parent folder, with a copy of the shipped sample runs in sample_run/ beside it",
    )
    parser.add_argument("--port", type=port_arg, default=8501, help="port of the dashboard [8501]")
    parser.add_argument("--no-dashboard", action="store_true", help="only train; print how to inspect the run")
    parser.set_defaults(func=demo_command)


def _make_sample_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rules",
        type=_rule_list,
        default="ppo,dppo_binary_tv,pg_is",
        help="rules of the sample, one run each [ppo,dppo_binary_tv,pg_is]",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="where to write it (default: the shipped data/sample_run)"
    )
    _add_run_set_options(parser)
    parser.set_defaults(func=make_sample_command)


_COMMAND_FLAGS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "train": _train_flags,
    "compare": _compare_flags,
    "claims": _claims_flags,
    "demo": _demo_flags,
    "make-sample": _make_sample_flags,
}


def configure(name: str, parser: argparse.ArgumentParser) -> None:
    """Add the flags of command `name` (train, compare, claims, demo or make-sample)."""
    if name not in _COMMAND_FLAGS:
        raise ValueError(f"trustlens.train.commands has no command {name!r}")
    parser.epilog = "presets: " + "; ".join(
        f"{preset} = {', '.join(f'{k}={v}' for k, v in values.items()) or 'the defaults'}"
        for preset, values in PRESETS.items()
    )
    parser.formatter_class = _LineHelpFormatter
    _COMMAND_FLAGS[name](parser)
    if name != "make-sample":
        # claims: None is collapse when training, and with --no-train the largest set of runs
        preset = None if name == "claims" else "default"
        chooses = "; with --no-train, it and the flags choose the runs measured" if name == "claims" else ""
        parser.add_argument(
            "--preset",
            choices=list(PRESETS),
            default=preset,
            help=f"named settings that the flags below override (listed at the end){chooses} [{preset or 'collapse'}]",
        )
    parser.add_argument("--overwrite", action="store_true", help="replace existing run directories instead of refusing")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    # compare and make-sample train several rules: per-rule thresholds make no sense there
    several = {"low", "high"} if name in ("compare", "make-sample", "claims") else set()
    # the demo trains its own seed when --seed is not given (trustlens.train.sample.DEMO_SEED)
    shown: dict[str, object] = {"seed": DEMO_SEED} if name == "demo" else {}
    _add_config_flags(parser, skip=several | ({"seed"} if name in ("compare", "claims") else set()), shown=shown)


def _add_config_flags(parser: argparse.ArgumentParser, skip: set[str], shown: dict[str, object]) -> None:
    """The TrainConfig flags but those in `skip`; `shown`: defaults --help shows in place of the
    default preset's."""
    defaults = field_defaults()
    group = parser.add_argument_group("training settings (default: the preset's value; shown: the default preset's)")
    for name, kind, text in _CONFIG_FLAGS:
        if name in skip:
            continue
        flag = "--" + name.replace("_", "-")
        default = {**_SHOWN_DEFAULTS, **shown}.get(name, defaults[name])
        group.add_argument(flag, dest=name, type=kind, default=None, help=f"{text} [{default}]")
    group.add_argument(
        "--no-scale-advantages",
        dest="scale_advantages",
        action="store_const",
        const=False,
        default=None,
        help="advantages r − mean(r) without dividing by the group std (Dr. GRPO)",
    )
    group.add_argument(
        "--routing-replay",
        dest="routing_replay",
        action="store_const",
        const=True,
        default=None,
        help="MoE: compute π_old and π with the engine's routing (router replay, R3)",
    )
    group.add_argument(
        "--alerts",
        dest="alerts",
        action="store_const",
        const=True,
        default=None,
        help="raise the collapse alerts and doctor findings live (progress line, mirror, the run's alerts table)",
    )


def _rule_list(text: str) -> list[str]:
    """Comma-separated rule names of the registry; a typo names the closest rule."""
    rules = [r.strip() for r in text.split(",") if r.strip()]
    if not rules:
        raise argparse.ArgumentTypeError(f"expected comma-separated rule names, got {text!r}")
    if len(set(rules)) != len(rules):
        raise argparse.ArgumentTypeError(f"a rule is listed twice in {text!r}")
    for rule in rules:
        try:
            check_choice("rule", rule, _rules())
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return rules


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _add_run_set_options(parser: argparse.ArgumentParser) -> None:
    """The options of the commands that train a set of runs (compare, claims): --reuse, --jobs."""
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep finished runs already in OUT with the same settings instead of training them again",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs trained at a time, each in its own process with --threads torch threads "
        "(e.g. 2 on a 2-core machine); not under torchrun [1]",
    )


def _train(args: argparse.Namespace) -> int:
    """Train one run; exit code 0, or EXIT_ALERT_STOP when --stop-on stopped it (status `stopped`)."""
    cfg = config(args, rule=args.rule)
    out = args.out or Path("runs") / args.rule
    try:
        result = run_one(cfg, out, overwrite=args.overwrite, quiet=args.quiet)
    finally:
        finish()
    if is_main():
        print_inspect(out)
    return 0 if result.stopped_step is None else EXIT_ALERT_STOP
