"""A real TRL GRPO run whose rollout engine writes log μ = 0 (a sentinel: a doctor problem from
its first generation) stops on `stop_on="critical"`, or on a `TrustLensCallback` attached with
`callbacks=[…]`: the callback saves and stops training, and run.json says why."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from test_integrations_trl import PROMPTS, grpo_args, length_reward, tiny  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

from trustlens import TokenRecorder, live_alerts, load_run  # noqa: E402
from trustlens.integrations.trl import TrustLensCallback, TrustLensGRPOTrainer, engine_rollout  # noqa: E402


def sentinel_rollout():
    """engine_rollout("fp32") whose log μ are all written as 0 (the engine's placeholder)."""
    rollout = engine_rollout("fp32")

    def planted(prompts, trainer):
        out = rollout(prompts, trainer)
        out["logprobs"] = [[0.0] * len(row) for row in out["logprobs"]]
        return out

    return planted


def test_a_critical_alert_saves_and_stops_trl(tmp_path):
    model, tok = tiny()
    seen = []
    trainer = TrustLensGRPOTrainer(
        model=model,
        processing_class=tok,
        reward_funcs=length_reward,
        args=grpo_args(tmp_path / "trl", max_steps=12),
        train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}),
        trustlens_dir=tmp_path / "run",
        rollout_func=sentinel_rollout(),
        stop_on="critical",
        on_alert=seen.append,
    )
    trainer.train()
    run = load_run(tmp_path / "run")
    why = run.manifest["stopped"]
    assert (why["on"], why["alert"]["kind"], why["alert"]["severity"]) == ("critical", "sentinel", "problem")
    assert trainer.state.global_step < 12  # stopped early
    assert why["checkpoint"] == os.path.join(str(tmp_path / "trl"), f"checkpoint-{trainer.state.global_step}")
    assert (tmp_path / "trl" / f"checkpoint-{trainer.state.global_step}").is_dir()
    assert run.manifest["planned_steps"] == 6  # 12 optimizer steps, 2 per generation
    assert any(a.kind == "sentinel" for a in live_alerts(run))
    assert [a.kind for a in seen if a.kind == "sentinel"]  # on_alert heard it too
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "stopped"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"stop_on": "critcal"}, ValueError, "stop_on must be one of critical, warning, never; got 'critcal'"),
        ({"on_alert": 3}, TypeError, "on_alert must be a callable"),
    ],
)
def test_bad_stop_settings_are_refused_before_training(tmp_path, kwargs, error, message):
    model, tok = tiny()
    with pytest.raises(error, match=message):
        TrustLensGRPOTrainer(
            model=model,
            processing_class=tok,
            reward_funcs=length_reward,
            args=grpo_args(tmp_path / "trl"),
            train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}),
            trustlens_dir=tmp_path / "run",
            **kwargs,
        )
    assert not (tmp_path / "run").exists()


def _trainer(tmp_path, **kwargs):
    model, tok = tiny()
    return TrustLensGRPOTrainer(
        model=model,
        processing_class=tok,
        reward_funcs=length_reward,
        args=grpo_args(tmp_path / "trl", max_steps=12),
        train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}),
        rollout_func=sentinel_rollout(),
        **kwargs,
    )


def test_a_callback_attached_with_callbacks_stops_a_run_on_its_own_recorder(tmp_path):
    """`callbacks=[TrustLensCallback(recorder)]` with `recorder=` stops as `stop_on=` does."""
    with TokenRecorder(tmp_path / "run", alerts=True, planned_steps=6) as recorder:
        trainer = _trainer(tmp_path, recorder=recorder, callbacks=[TrustLensCallback(recorder, stop_on="critical")])
        trainer.train()
    why = load_run(tmp_path / "run").manifest["stopped"]
    assert (why["on"], why["alert"]["kind"], why["alert"]["severity"]) == ("critical", "sentinel", "problem")
    assert trainer.state.global_step < 12
    assert why["checkpoint"] == os.path.join(str(tmp_path / "trl"), f"checkpoint-{trainer.state.global_step}")
    # the generation it stopped at, as stop_on= records it: 2 optimizer steps per generation
    assert why["step"] == (trainer.state.global_step - 1) // 2


def test_bad_callbacks_are_refused(tmp_path):
    with pytest.raises(TypeError, match="recorder must be a TokenRecorder"):
        TrustLensCallback({"live_alerts": []})
    with TokenRecorder(tmp_path / "run", alerts=True) as recorder, TokenRecorder(tmp_path / "other") as other:
        with pytest.raises(ValueError, match="stop_on must be one of critical, warning, never; got 'critcal'"):
            TrustLensCallback(recorder, stop_on="critcal")
        with pytest.raises(ValueError, match="pass stop_on= or a TrustLensCallback in callbacks=, not both"):
            _trainer(tmp_path, recorder=recorder, stop_on="critical", callbacks=[TrustLensCallback(recorder)])
        with pytest.raises(ValueError, match="watches another recorder than the one this trainer records into"):
            _trainer(tmp_path, recorder=recorder, callbacks=[TrustLensCallback(other)])
        model, tok = tiny()
        plain = GRPOTrainer(  # nothing records into the recorder: refused before the first step
            model=model,
            processing_class=tok,
            reward_funcs=length_reward,
            args=grpo_args(tmp_path / "plain"),
            train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}),
            callbacks=[TrustLensCallback(recorder)],
        )
        with pytest.raises(ValueError, match="TrustLensCallback stops a run that TrustLensGRPOTrainer"):
            plain.train()
        assert plain.state.global_step == 0
