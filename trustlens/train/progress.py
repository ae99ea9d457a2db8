"""The progress line of a built-in run (`trustlens train`): tqdm's bar with the step's reward, the
latest held-out accuracies (greedy and sampled) and the live alerts so far."""

from __future__ import annotations


def progress_bar(total: int, enabled: bool):
    """A tqdm bar over `total` steps, or None when not `enabled`. It shows no rate: the run's one
    speed figure is run_one's s/step at the end."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    bar = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"
    return tqdm(total=total, desc="train", unit="step", dynamic_ncols=True, bar_format=bar)


def show_step(
    bar, logged: dict[str, float], accuracy: dict[int, float], accuracy_sampled: dict[int, float], alerts: list
) -> None:
    """Advance `bar` by one step: the step's mean reward, the latest evaluation's accuracies (step ->
    share correct) and `alert_postfix(alerts)`."""
    bar.update(1)
    last = max(accuracy, default=None)
    bar.set_postfix(
        reward=f"{logged['reward/mean']:.2f}",
        acc=f"{accuracy[last]:.2f}" if last is not None else "-",
        acc_sampled=f"{accuracy_sampled[last]:.2f}" if last is not None else "-",
        **alert_postfix(alerts),
    )


def alert_postfix(alerts: list) -> dict[str, str]:
    """The progress line's alert field: how many alerts of warning or above so far and the most
    severe latest one ({} without any)."""
    shown = [a for a in alerts if a.level >= 1]
    if not shown:
        return {}
    worst = max(shown, key=lambda a: (a.level, a.raised_at_step))
    return {"alerts": f"{len({a.key for a in shown})} ({worst.severity} {worst.kind} @{worst.step})"}


__all__ = ["alert_postfix", "progress_bar", "show_step"]
