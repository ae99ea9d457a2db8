"""run.json, the manifest of a recorded run: its fields, creation, atomic updates and reading.

Rank 0 writes run.json; it is replaced atomically (temporary file, fsync, rename), so a reader
sees the previous or the next version, never a partial one. Statuses:

    running      a writer has it open (or was killed by SIGKILL / power loss: see `updated`)
    finished     closed normally
    interrupted  ended by SIGTERM, SIGINT or KeyboardInterrupt (`signal` says which); every
                 row passed to the recorder before the signal was written
    failed       the writer or the training loop raised (`error` says what)
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trustlens.core.version import __version__
from trustlens.run.errors import NotARunError
from trustlens.run.schema import OLDEST_SCHEMA_VERSION, SCHEMA_VERSION
from trustlens.run.storage import Remote, write_local_atomic

MANIFEST = "run.json"
STATUSES = ("running", "finished", "stopped", "interrupted", "failed")
# the statuses of a closed run: no writer will add rows (`stopped`: closed early on a live alert,
# run.json `stopped` says why)
CLOSED = STATUSES[1:]

# the keys of run.json and their meaning
MANIFEST_FIELDS: dict[str, str] = {
    "schema_version": "version of the run format (trustlens.run.SCHEMA_VERSION) the run was written with",
    "trustlens_version": "trustlens version that wrote the run",
    "run_id": "random id of the run, kept when it is resumed (resume=True) and new when overwritten",
    "status": "running | finished | stopped | interrupted | failed",
    "error": "what ended a failed or interrupted run (type: message), else null",
    "signal": "the signal that interrupted the run (SIGTERM, SIGINT), else null",
    "created": "UTC time the run was first opened, ISO 8601",
    "updated": "UTC time of the last part file or status change, ISO 8601",
    "resumed": "UTC times the run was reopened with resume=True",
    "resumed_after": "the last step recorded before each reopen with resume=True (null: none yet), in "
    "`resumed`'s order: the run's resume points",
    "config": "the training configuration passed to the recorder (free-form JSON)",
    "rules": "every evaluated rule: {name: {low, high, anchor, measure, weight, tis_cap, description}}",
    "active_rule": "the rule the run trains with (null when unknown)",
    "world_size": "number of ranks recording shards",
    "anchor": "what ratio and divergences compare π with: mu (the rollout policy), old (π_old, "
    "when μ was not recorded) or mixed; null before the first record",
    "missing": "token quantities never recorded so far (their columns are null)",
    "flush": "writer settings: rows_per_file, flush_seconds (the most a killed run loses) and flush_steps "
    "(each step written at its end)",
    "sampling": "how the rollout engine sampled and what log μ it reported: {temperature, top_p, top_k, "
    "min_p, logprobs (raw | tempered | processed), processors (the active logit processors)}, null for a "
    "filter that is off or a value not known; null when not given",
    "model_kind": "dense or moe: the kind of model trained (the published mismatch ranges differ)",
    "planned_steps": "training steps the run plans (sets the live alerts' baseline window, trustlens.live); "
    "null when not given (the built-in trainer's config.steps stands in)",
    "stopped": "why the run stopped on a live alert (status stopped): {on, alert: {kind, step, severity, "
    "raised_at_step, message}, step, evidence_start_step, checkpoint, checkpoint_step, checkpoint_accuracy}; "
    "null when it did not",
}
# the keys of run.json the analyses read, and what a run.json without one loses (an older or a
# hand-written one; `load_run` warns and reads the run with what it has)
NEEDED_FIELDS: dict[str, str] = {
    "rules": "the rules' thresholds (the rules are taken from the blocked_<rule> columns)",
    "active_rule": "which rule the run trained with (none shown)",
    "anchor": "what π was compared with (μ where mu_logp holds values)",
    "status": "whether the run finished (status unknown)",
    "world_size": "how many ranks recorded it",
}
# the keys of run.json `sampling`
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "logprobs", "processors")
# the kinds of log μ: before the temperature (raw), after it and before the filters (tempered), or
# of the distribution the token was drawn from, after every processor and the filters (processed)
LOGPROBS_MODES = ("raw", "tempered", "processed")
# logit processors besides the temperature and the filters that change μ (sampling["processors"])
PROCESSORS = (
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "bad_words",
    "allowed_token_ids",
    "min_tokens",
    "grammar",
    "custom",
)
MODEL_KINDS = ("dense", "moe")


def utc_now() -> str:
    """The current UTC time, ISO 8601 with seconds."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_manifest(
    *,
    rules: dict[str, dict[str, Any]],
    active_rule: str | None,
    config: dict[str, Any] | None,
    world_size: int,
    anchor: str | None = None,
    missing: list[str] | None = None,
    flush: dict[str, Any] | None = None,
    sampling: Mapping[str, Any] | None = None,
    model_kind: str = "dense",
    planned_steps: int | None = None,
) -> dict[str, Any]:
    """A run.json for a new run (status `running`), with every field of MANIFEST_FIELDS;
    `sampling` and `model_kind` checked (`normalise_sampling`, MODEL_KINDS)."""
    if model_kind not in MODEL_KINDS:
        raise ValueError(f"model_kind must be one of {', '.join(MODEL_KINDS)}, got {model_kind!r}")
    sampling = normalise_sampling(sampling)
    now = utc_now()
    return {
        "schema_version": SCHEMA_VERSION,
        "trustlens_version": __version__,
        "run_id": uuid.uuid4().hex,
        "status": "running",
        "error": None,
        "signal": None,
        "created": now,
        "updated": now,
        "resumed": [],
        "resumed_after": [],
        "config": config,
        "rules": rules,
        "active_rule": active_rule,
        "world_size": world_size,
        "anchor": anchor,
        "missing": list(missing or []),
        "flush": flush,
        "sampling": sampling,
        "model_kind": model_kind,
        "planned_steps": planned_steps,
        "stopped": None,
    }


def normalise_sampling(sampling: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`sampling` of run.json with every key of SAMPLING_KEYS: temperature τ (finite, > 0), top_p
    in (0, 1], top_k an int ≥ 1, min_p in [0, 1), logprobs one of LOGPROBS_MODES, processors a
    list of PROCESSORS (sorted, [] for none); each may be None (not known). A filter that is off
    becomes None: top_p 1, top_k 0 or −1 (HF and vLLM's "off"), min_p 0. None stays None (not
    recorded). Raises ValueError naming the key for an unknown key or a value out of range."""
    if sampling is None:
        return None
    if not isinstance(sampling, Mapping):
        raise ValueError(f"sampling must be a mapping with keys {', '.join(SAMPLING_KEYS)}, got {sampling!r}")
    unknown = sorted(set(sampling) - set(SAMPLING_KEYS))
    if unknown:
        raise ValueError(f"sampling has unknown keys {unknown}; known: {', '.join(SAMPLING_KEYS)}")
    out: dict[str, Any] = dict.fromkeys(SAMPLING_KEYS)
    for key in ("temperature", "top_p", "min_p"):
        value = sampling.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"sampling[{key!r}] must be a number or None, got {value!r}")
        value = float(value)
        ok = {"temperature": 0 < value < math.inf, "top_p": 0 < value <= 1, "min_p": 0 <= value < 1}[key]
        if not ok:
            expected = {"temperature": "finite and > 0", "top_p": "in (0, 1]", "min_p": "in [0, 1)"}[key]
            raise ValueError(f"sampling[{key!r}] must be {expected}, got {value!r}")
        out[key] = value
    top_k = sampling.get("top_k")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < -1:
            raise ValueError(f"sampling['top_k'] must be an int ≥ 1 (0 or −1: off) or None, got {top_k!r}")
        out["top_k"] = top_k if top_k > 0 else None
    logprobs = sampling.get("logprobs")
    if logprobs is not None and logprobs not in LOGPROBS_MODES:
        raise ValueError(f"sampling['logprobs'] must be one of {', '.join(LOGPROBS_MODES)} or None, got {logprobs!r}")
    out["logprobs"] = logprobs
    processors = sampling.get("processors")
    if processors is not None:
        if isinstance(processors, (str, bytes, Mapping)) or not all(p in PROCESSORS for p in processors):
            raise ValueError(
                f"sampling['processors'] must be a list of {', '.join(PROCESSORS)} or None, got {processors!r}"
            )
        out["processors"] = sorted(set(processors))
    if out["top_p"] == 1.0:
        out["top_p"] = None
    if out["min_p"] == 0.0:
        out["min_p"] = None
    return out


def write_json_atomic(path: Path | Remote, obj: dict[str, Any]) -> None:
    """Write `obj` as JSON to `path` so that readers only ever see a complete file; no temporary
    file is left behind, also when the write fails. On an object store: one upload."""
    text = (json.dumps(obj, indent=2, default=str) + "\n").encode()
    if isinstance(path, Remote):
        path.write_bytes(text)
        return
    write_local_atomic(path, lambda f: f.write(text))


def read_manifest(path: Path | Remote) -> dict[str, Any]:
    """run.json of the run directory `path`. Raises NotARunError when it is missing or was
    written by a newer schema version; ValueError (not a NotARunError) when it exists but is
    unreadable or not a trustlens manifest, so that callers can still load the parts."""
    manifest_path = path / MANIFEST
    no_run = (
        f"{str(path)!r} is not a trustlens run: it has no {MANIFEST} (a run directory is "
        "written by trustlens.TokenRecorder)"
    )
    if isinstance(path, Path) and not path.is_dir():
        what = "it is a file, not a directory" if path.exists() else "no such file or directory"
        raise NotARunError(
            f"{str(path)!r} is not a trustlens run: {what}; give a run's folder (the directory holding {MANIFEST})"
        )
    try:
        data = manifest_path.read_bytes()
    except FileNotFoundError:
        raise NotARunError(no_run) from None
    except IsADirectoryError:
        raise NotARunError(no_run) from None
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{str(manifest_path)!r} is unreadable: {err}") from err
    version = manifest.get("schema_version") if isinstance(manifest, dict) else None
    if not isinstance(version, int) or version < OLDEST_SCHEMA_VERSION:
        raise ValueError(f"{str(manifest_path)!r} has no valid schema_version: not a trustlens manifest")
    if not isinstance(manifest.get("rules") or {}, dict):
        raise ValueError(f"{str(manifest_path)!r} has rules {manifest['rules']!r:.80}: not a mapping of rule names")
    if version > SCHEMA_VERSION:
        raise NotARunError(
            f"run {str(path)!r} was written with schema version {version} (trustlens "
            f"{manifest.get('trustlens_version')}); this trustlens reads up to version "
            f"{SCHEMA_VERSION}: upgrade trustlens"
        )
    return manifest
