"""Mixture-of-experts routing: which experts the engine and the trainer chose for each token,
and how much of the training–inference mismatch that explains.

- the recorded routing's queries (trustlens.analysis.routing, re-exported here): how much of the
  mismatch the tokens routed differently carry;
- `trustlens.routing.replay`: read and force a model's routing (`routing`), and the shadow
  forward under μ's routing that splits Δ log p into a routing and a residual part (`replay_split`).

    from trustlens.routing import mismatch_by_flips, routing_share
    share = routing_share(run)          # None on a dense run
    mismatch_by_flips(run)              # k3 and |Δ log p| on tokens with 0, 1, 2+ flipped layers
    measured_split(run)                 # the shadow forward's split, where the run logged it
"""

from trustlens.analysis.routing import (
    FLIP_BUCKETS,
    MeasuredSplit,
    RoutingShare,
    flipped_layers,
    flipped_tokens,
    flips_per_layer,
    measured_split,
    mismatch_by_first_flip,
    mismatch_by_flips,
    routed_rows,
    routing_share,
)

_REPLAY = ("RoutingSplit", "replay_split", "routing")  # need torch: imported when first asked for


def __getattr__(name: str) -> object:
    """`RoutingSplit`, `replay_split` and `routing` from trustlens.routing.replay (torch), so that
    reading a run's routing needs no torch."""
    if name in _REPLAY:
        from trustlens.routing import replay

        return getattr(replay, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FLIP_BUCKETS",
    "MeasuredSplit",
    "RoutingShare",
    "RoutingSplit",
    "flipped_layers",
    "flipped_tokens",
    "flips_per_layer",
    "measured_split",
    "mismatch_by_first_flip",
    "mismatch_by_flips",
    "replay_split",
    "routed_rows",
    "routing",
    "routing_share",
]
