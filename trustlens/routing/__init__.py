"""Mixture-of-experts routing: how much of the training–inference mismatch the tokens routed
differently by the engine and the trainer carry (the queries: trustlens.analysis.routing; the recorded
routing: trustlens.run.routes, docs/run-format.md).

    from trustlens.routing import mismatch_by_flips, routing_share
    share = routing_share(run)          # None on a dense run
    mismatch_by_flips(run)              # k3 and |Δ log p| on tokens with 0, 1, 2+ flipped layers
"""

from trustlens.analysis.routing import (
    FLIP_BUCKETS,
    RoutingShare,
    flipped_layers,
    flipped_tokens,
    flips_per_layer,
    mismatch_by_first_flip,
    mismatch_by_flips,
    routed_rows,
    routing_share,
)

__all__ = [
    "FLIP_BUCKETS",
    "RoutingShare",
    "flipped_layers",
    "flipped_tokens",
    "flips_per_layer",
    "mismatch_by_first_flip",
    "mismatch_by_flips",
    "routed_rows",
    "routing_share",
]
