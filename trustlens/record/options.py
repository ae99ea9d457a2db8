"""`TokenRecorder`'s constructor arguments, checked before the run is opened (a bad one raises
ValueError or TypeError naming it), and what they set up besides the writer: the run.json of a
new run and the live taps (mirror, live alerts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trustlens.core.argument_checks import check_bool, check_path
from trustlens.record.args import check_tokenizer, config_dict, distributed_rank, int_arg, positive_seconds
from trustlens.rules import RULES, Rule, RuleSpec, resolve_rules
from trustlens.run.aggregates import Keep, check_kept_rules
from trustlens.run.background import BackgroundWriter
from trustlens.run.manifest import new_manifest
from trustlens.run.writer import RankWriter


@dataclass
class RecorderOptions:
    """A recorder's checked options (trustlens.record.recorder.TokenRecorder documents each)."""

    rules: list[Rule]  # the evaluated rules, resolved
    keep: Keep | None  # record-time sampling, or None: every token
    flush_steps: bool  # write each step's rows at its end_step
    live: bool  # the live alerts are on (alerts or on_alert given)
    rows_per_file: int  # token rows per part file
    queue_size: int  # batches the writer may hold
    flush_seconds: float  # the longest rows wait before they are written
    writer_timeout: float  # the longest a call waits on the writer
    rank: int  # this process's rank
    world_size: int  # the run's number of ranks
    manifest: dict[str, Any]  # run.json of a new run


def recorder_options(
    run_dir: str | Path,
    *,
    rules: RuleSpec | None,
    active_rule: str | None,
    tokenizer: Any | None,
    config: Any | None,
    rows_per_file: int,
    flush_seconds: float,
    flush_steps: bool | None,
    queue_size: int,
    rank: int | None,
    world_size: int | None,
    enabled: bool,
    resume: bool,
    overwrite: bool,
    writer_timeout: float,
    keep: Keep | None,
    sampling: Mapping[str, Any] | None,
    model_kind: str,
    alerts: Any,
    on_alert: Any | None,
    planned_steps: int | None,
) -> RecorderOptions:
    """The constructor's arguments checked, with the manifest they give."""
    check_path("run_dir", run_dir)
    for name, flag in (("enabled", enabled), ("resume", resume), ("overwrite", overwrite)):
        check_bool(name, flag)
    live = alerts is not False or on_alert is not None
    flush_steps = live if flush_steps is None else check_bool("flush_steps", flush_steps)
    check_tokenizer(tokenizer)
    if keep is not None and not isinstance(keep, Keep):
        raise ValueError(f"keep must be a trustlens.Keep or None, got {keep!r}")
    resolved = resolve_rules(list(RULES) if rules is None else rules)
    names = [r.name for r in resolved]
    if active_rule is not None and active_rule not in names:
        raise ValueError(f"active_rule {active_rule!r} is not among the evaluated rules {names}")
    check_kept_rules(keep, names)
    rows_per_file = int_arg("rows_per_file", rows_per_file, 1, 2**31)
    queue_size = int_arg("queue_size", queue_size, 1, 2**31)
    flush_seconds = positive_seconds("flush_seconds", flush_seconds)
    writer_timeout = positive_seconds("writer_timeout", writer_timeout)
    rank, world_size = distributed_rank(rank, world_size)
    manifest = new_manifest(
        rules={r.name: r.manifest_entry() for r in resolved},
        active_rule=active_rule,
        config=config_dict(config),
        world_size=world_size,
        flush={"rows_per_file": rows_per_file, "flush_seconds": flush_seconds, "flush_steps": flush_steps},
        sampling=sampling,
        model_kind=model_kind,
        planned_steps=None if planned_steps is None else int_arg("planned_steps", planned_steps, 1, 2**31),
    )
    return RecorderOptions(
        rules=resolved,
        keep=keep,
        flush_steps=flush_steps,
        live=live,
        rows_per_file=rows_per_file,
        queue_size=queue_size,
        flush_seconds=flush_seconds,
        writer_timeout=writer_timeout,
        rank=rank,
        world_size=world_size,
        manifest=manifest,
    )


def live_taps(mirror: Any | None, alerts: Any, on_alert: Any | None, live: bool) -> tuple[Any | None, Any | None]:
    """(the mirror's sink or None, the live-alert tap or None), made before the run is opened so
    that a bad mirror or alerts argument fails first."""
    tap = None
    if mirror is not None:
        from trustlens.export.mirror import make_mirror

        tap = make_mirror(mirror)
    if not live:
        return tap, None
    from trustlens.live.tap import live_tap

    return tap, live_tap(alerts, on_alert, mirror=tap)


def open_writer(
    run_dir: str | Path,
    opts: RecorderOptions,
    *,
    tokenizer: Any | None,
    resume: bool,
    overwrite: bool,
    taps: tuple[Any | None, Any | None],
) -> BackgroundWriter:
    """The recorder's rank of the run opened (trustlens.run.writer.RankWriter) and its background
    writer started with the taps (`live_taps`; the live tap started on the writer). run.json of a
    resumed run keeps how μ was made (an older run gains it) and says how a sampled run was drawn."""
    manifest = opts.manifest
    rank_writer = RankWriter(
        run_dir,
        rank=opts.rank,
        world_size=opts.world_size,
        rules=[r.name for r in opts.rules],
        manifest=manifest if opts.rank == 0 else None,
        rows_per_file=opts.rows_per_file,
        tokenizer=tokenizer,
        resume=resume,
        overwrite=overwrite,
        flush_steps=opts.flush_steps,
    )
    mirror, live = taps
    if live is not None:
        live.start(rank_writer, manifest, opts.rank)
    writer = BackgroundWriter(
        rank_writer,
        flush_seconds=opts.flush_seconds,
        queue_size=opts.queue_size,
        writer_timeout=opts.writer_timeout,
        taps=[t for t in (mirror, live) if t is not None],
    )
    kept = rank_writer.manifest or {}
    gained = {key: manifest[key] for key in ("sampling", "model_kind") if key not in kept}
    if gained:
        writer.put_manifest(gained)
    if opts.keep is not None:
        writer.put_manifest({"keep": dataclasses.asdict(opts.keep)})
    return writer
