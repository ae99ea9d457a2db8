"""Mixture-of-experts routing in a run (docs/run-format.md, "Routing"): the per-token route columns
and the `routing` table of exact per-(step, update, layer) counts.

For a token and an MoE layer l (one whose expert ids are not all −1), S_μ and S_π are the sets
of the k experts the rollout engine and the trainer routed it to. The layer is *flipped* when
S_μ ≠ S_π. Per token row:
    route_flips        the number of flipped MoE layers
    route_first_flip   the first flipped layer (null: none)
    route_overlap      mean over MoE layers of |S_μ ∩ S_π| / k (null: no MoE layer)
    route_layers       the flipped layers, in order
    route_mu_experts   S_μ at each of them, k ids per listed layer (sorted)
    route_pi_experts   S_π at each of them, k ids per listed layer (sorted)
The `routing` table holds per (step, update, layer) the MoE tokens, the flipped ones and
Σ |S_μ ∩ S_π| / k over all of a `record` call's tokens, kept or not: its counts are exact in a
sampled run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

# the per-token route columns the recorder derives, kept with the other float inputs until written
ROUTE_SCALARS = ("route_flips", "route_first_flip", "route_overlap")
ROUTE_LISTS = ("route_layers", "route_mu_experts", "route_pi_experts")
# the columns of the routing table's counts (after step, update, layer)
ROUTING_COUNTS = ("tokens", "flips", "overlap")


@dataclass
class RouteLists:
    """The expert sets of a TokenBatch's rows at their flipped layers: row i's entries are
    `layers[offsets[i]:offsets[i + 1]]` and the same rows of `mu`, `pi`."""

    offsets: np.ndarray  # (N + 1,) int32, ascending, offsets[0] = 0
    layers: np.ndarray  # (M,) int16 flipped layers
    mu: np.ndarray  # (M, k) int16 S_μ at them, sorted
    pi: np.ndarray  # (M, k) int16 S_π at them, sorted

    def take(self, kept: np.ndarray) -> RouteLists:
        """The lists of the rows where `kept` (N,) bool is True."""
        counts = np.diff(self.offsets)[kept]
        entry = np.repeat(kept, np.diff(self.offsets))  # (M,) whether each entry's row is kept
        offsets = np.zeros(len(counts) + 1, np.int32)
        np.cumsum(counts, out=offsets[1:])
        return RouteLists(offsets, self.layers[entry], self.mu[entry], self.pi[entry])

    def arrays(self) -> dict[str, pa.Array]:
        """The three list columns (list<int16>), one list per row."""
        k = self.mu.shape[1]
        offsets = pa.array(self.offsets, pa.int32())
        return {
            "route_layers": pa.ListArray.from_arrays(offsets, pa.array(self.layers, pa.int16())),
            "route_mu_experts": pa.ListArray.from_arrays(pa.array(self.offsets * k), pa.array(self.mu.reshape(-1))),
            "route_pi_experts": pa.ListArray.from_arrays(pa.array(self.offsets * k), pa.array(self.pi.reshape(-1))),
        }


def route_scalar_array(values: np.ndarray, kind: pa.DataType) -> pa.Array:
    """A route scalar column as stored: the recorder carries it as float32 with −1 for "none"
    (route_first_flip without a flip, route_overlap without an MoE layer), which is null here."""
    none = values < 0
    if pa.types.is_integer(kind):
        return pa.array(np.where(none, 0, values).astype(np.int16), kind, mask=none)
    return pa.array(values, kind, mask=none)


def routing_batch(counts: np.ndarray, k: int, step: int, update: int, schema: pa.Schema) -> pa.RecordBatch:
    """The routing table's rows of one `record` call: `counts` (3, L) int64 holds per layer the
    MoE tokens, the flipped ones and Σ |S_μ ∩ S_π| (shared experts); dense layers (no MoE
    token) get no row."""
    moe = np.flatnonzero(counts[0] > 0)
    n = len(moe)
    columns = {
        "step": np.full(n, step, np.int32),
        "update": np.full(n, update, np.int16),
        "layer": moe.astype(np.int16),
        "tokens": counts[0, moe],
        "flips": counts[1, moe],
        "overlap": counts[2, moe] / k,
    }
    return pa.RecordBatch.from_arrays([pa.array(columns[f.name], f.type) for f in schema], schema=schema)
