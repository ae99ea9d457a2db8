"""The mirror and on_alert hear each alert episode once, and once more when it turns critical,
never once per step (trustlens.live.tap), on a long collapsing run replayed live."""

import time
from collections import Counter

from trustlens.analysis import CollapseConfig, detect_collapse
from trustlens.live import LiveMonitor, replay
from trustlens.live.tap import LiveTap
from trustlens.run import load_run
from trustlens.synthetic import Drift, write_synthetic_run


class _Mirror:
    def __init__(self):
        self.sent = []

    def alert(self, alert):
        self.sent.append((alert.kind, alert.signal, alert.step, alert.severity))


def test_one_message_per_episode_and_one_when_it_turns_critical(tmp_path):
    path = write_synthetic_run(
        tmp_path / "run",
        steps=400,
        samples_per_step=16,
        seq_len=8,
        group_size=8,
        rules=["ppo"],
        active_rule="ppo",
        drift=Drift(warmup_steps=30, eval_every=10),
        collapse_at=300,
    )
    run = load_run(path)
    mirror = _Mirror()
    tap = LiveTap(CollapseConfig(), mirror=mirror)
    tap.monitor = LiveMonitor.for_run(run, doctor=None)
    for _, alerts in replay(run, tap.monitor):
        tap._emit(alerts, time.monotonic())
    alerts = detect_collapse(run)
    severity_ne = alerts["severity"] != "info"
    offline = alerts.filter(severity_ne)
    episodes = {(a["kind"], a["signal"], a["step"]) for a in offline.iter_rows(named=True)}
    # each episode of warning or above once, and a second time only to say it turned critical
    assert {(k, s, st) for k, s, st, _ in mirror.sent} == episodes
    assert len(set(mirror.sent)) == len(mirror.sent)
    per = Counter((k, s, st) for k, s, st, _ in mirror.sent)
    assert max(per.values()) <= 2
    assert [sev for k, s, st, sev in mirror.sent if per[(k, s, st)] == 2][1::2] == ["critical"] * (
        sum(n == 2 for n in per.values())
    )
    assert severity_ne.any() and len(mirror.sent) < 20  # 100 steps after the collapse: no storm
