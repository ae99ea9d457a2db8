"""Bytes on disk per trained token of a sampled mixture-of-experts record against the same record
without routing (issue 49.2: routing must stay within the sampling budget).

    python benchmarks/route_bytes.py [--calls 20] [--batch 64] [--length 256] [--layers 48] [--k 8]

Records the same synthetic calls (seeded log-probabilities, every rule of the registry evaluated
where the inputs allow it: no top-K here) twice with `Keep(rate)`: without routed experts (the
baseline) and with them (`--experts` experts per layer, top `--k`, each token's layer flipped
with probability `--flip`), and prints bytes per trained token of the token rows plus the
aggregates (plus, with routing, the routing table) and the ratio to the baseline, with the
routing table's counts checked against the calls' own.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from trustlens import Keep, TokenRecorder, load_run


def calls(args: argparse.Namespace):
    """The seeded calls: (kwargs of record, flipped (token, layer) count per layer)."""
    g = torch.Generator().manual_seed(0)
    shape = (args.batch, args.length)
    for _ in range(args.calls):
        mu = (-torch.rand(shape, generator=g) * 2).clamp(max=-1e-3)  # μ ≥ 0.135: none kept as rare
        old = mu + 0.05 * torch.randn(shape, generator=g)
        base = torch.randint(0, args.experts - args.k, (*shape, args.layers, 1), generator=g)
        mu_experts = base + torch.arange(args.k)  # (B, T, L, k) distinct ids
        flipped = torch.rand((*shape, args.layers), generator=g) < args.flip
        pi_experts = mu_experts.clone()
        pi_experts[..., -1] = torch.where(flipped, base[..., 0] + args.k, mu_experts[..., -1])
        kwargs = dict(
            token_ids=torch.randint(0, 30_000, shape, generator=g),
            response_mask=torch.ones(shape, dtype=torch.bool),
            pi_logp=old.clamp(max=0.0),
            old_logp=old.clamp(max=0.0),
            mu_logp=mu,
            advantages=torch.randn(args.batch, generator=g),
        )
        routing = dict(mu_routed_experts=mu_experts, pi_routed_experts=pi_experts, num_experts=args.experts)
        yield kwargs, routing, flipped.sum((0, 1))


def record(path: Path, args: argparse.Namespace, routed: bool) -> tuple[int, list[int]]:
    """(bytes of the run's tables, flipped counts per layer the calls made)."""
    flips = torch.zeros(args.layers, dtype=torch.long)
    with TokenRecorder(path, keep=Keep(rate=args.rate), active_rule="ppo", flush_seconds=3600) as rec:
        for step, (kwargs, routing, flipped) in enumerate(calls(args)):
            rec.record(step, **kwargs, **(routing if routed else {}))
            flips += flipped
    size = sum(f.stat().st_size for t in ("tokens", "aggregates", "routing") for f in (path / t).rglob("*.parquet"))
    return size, flips.tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("calls", 20), ("batch", 64), ("length", 256), ("layers", 48), ("k", 8), ("experts", 64)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--flip", type=float, default=0.1, help="probability that a token's layer flips [0.1]")
    parser.add_argument("--rate", type=float, default=0.01, help="Keep rate [0.01]")
    args = parser.parse_args()
    tokens = args.calls * args.batch * args.length
    with tempfile.TemporaryDirectory() as tmp:
        dense, _ = record(Path(tmp) / "dense", args, routed=False)
        moe, flips = record(Path(tmp) / "moe", args, routed=True)
        run = load_run(Path(tmp) / "moe")
        table = run.routing.group_by("layer").agg(pl_sum("flips")).sort("layer").collect()["flips"].to_list()
        kept = run.tokens.select("step").collect().height
    assert table == flips, "the routing table's flips differ from the calls'"
    print(f"{tokens:,} trained tokens, {kept / tokens:.2%} of the rows kept with routing")
    print(f"without routing: {dense / tokens:.3f} bytes per trained token")
    print(f"with routing:    {moe / tokens:.3f} bytes per trained token ({moe / dense:.3f}× the baseline)")
    print("routing table flips per layer equal the calls' exactly")


def pl_sum(column: str):
    import polars as pl

    return pl.col(column).sum()


if __name__ == "__main__":
    main()
