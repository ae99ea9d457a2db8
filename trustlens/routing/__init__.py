"""Mixture-of-experts routing: which experts the engine and the trainer chose for each token,
and how much of the training–inference mismatch that explains.

- `trustlens.routing.replay`: read and force a model's routing (`routing`), and the shadow
  forward under μ's routing that splits Δ log p into a routing and a residual part (`replay_split`).
"""

from trustlens.routing.replay import RoutingSplit, replay_split, routing

__all__ = ["RoutingSplit", "replay_split", "routing"]
