"""SIGTERM / SIGINT / KeyboardInterrupt end a run `interrupted` with every row (trustlens.run.interrupts)."""

import json
import signal
import subprocess
import sys
import textwrap

import polars as pl
import pytest
import torch

from trustlens import TokenRecorder, load_run

# Records step after step (one part file would take 10⁶ rows and 1000 s: every row stays in the
# writer's buffer or queue), printing each step once `record` returned.
CHILD = textwrap.dedent(
    """
    import sys, time, torch
    torch.set_num_threads(1)
    from trustlens import TokenRecorder
    g = torch.Generator().manual_seed(0)
    mu = -torch.rand(4, 16, generator=g) - 0.01
    batch = dict(token_ids=torch.randint(0, 50, (4, 16), generator=g), response_mask=torch.ones(4, 16),
                 pi_logp=mu * 0.9, mu_logp=mu, advantages=torch.tensor([1.0, -1.0, 0.5, 0.0]))
    with TokenRecorder(sys.argv[1], rules=["ppo"], rows_per_file=10**6, flush_seconds=1000, queue_size=4) as rec:
        for step in range(100000):
            rec.record(step, **batch)
            rec.log_metrics(step, {"step": step})
            print(step, flush=True)
            time.sleep(0.01)
    """
)


def _interrupt_child(run_dir, sig: int, after: int) -> tuple[int, int]:
    """Run CHILD, send `sig` once it printed step `after`; (its return code, last step printed)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        last = -1
        while last < after:
            line = child.stdout.readline()
            assert line, "child died"
            last = int(line)
        child.send_signal(sig)
        out, _ = child.communicate(timeout=60)
        last = max([last, *map(int, out.split())])
    finally:
        child.kill()
    return child.returncode, last


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_mid_run_keeps_every_recorded_row(tmp_path, sig):
    code, last = _interrupt_child(tmp_path / "run", sig, after=20)
    # the process ends as it would have without trustlens: killed by SIGTERM; for SIGINT an
    # uncaught KeyboardInterrupt, which Python ends by SIGINT too
    assert code == -sig
    run = load_run(tmp_path / "run")
    assert run.status == "interrupted" and run.manifest["signal"] == signal.Signals(sig).name
    df = run.tokens.collect()
    steps = sorted(set(df["step"]))
    assert steps[: last + 1] == list(range(last + 1))  # every row recorded before the signal
    assert df.height == 64 * len(steps)
    assert run.metrics.select(pl.len()).collect().item() >= last + 1
    assert not list((tmp_path / "run").rglob("*.tmp"))


def test_keyboard_interrupt_in_the_with_block_ends_interrupted(tmp_path):
    mu = -torch.rand(2, 3) - 0.1
    batch = dict(token_ids=torch.zeros(2, 3, dtype=torch.long), response_mask=torch.ones(2, 3), pi_logp=mu, mu_logp=mu)
    with pytest.raises(KeyboardInterrupt), TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        rec.record(0, advantages=torch.ones(2), **batch)
        raise KeyboardInterrupt
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["signal"] == "SIGINT"
    assert load_run(tmp_path / "run").tokens.select(pl.len()).collect().item() == 6
