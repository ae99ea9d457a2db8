"""Benchmark: top-K and exact divergences against the full-log-softmax reference forms.

    python benchmarks/divergence.py [--n 1024] [--vocab 151936] [--k 20] [--dtype float32] [--only topk]

Reference for the top-K divergence: a full float32 log_softmax over the vocabulary, then a gather
of μ's top-K ids, then the bucket sums (how the DPPO reference code computes it), run eagerly and
under torch.compile. Reference for the exact divergence: two full log_softmax tensors. All are
measured in this run, on one thread:

- time: the median over --reps calls, variants interleaved call by call so that load from other
  processes hits all of them alike;
- peak extra memory: each variant in its own subprocess, after a warm-up call (which also
  compiles), the kernel's peak-RSS mark is reset (/proc/self/clear_refs) and the growth of VmHWM
  over VmRSS during one call is read. Inputs are not counted; glibc is told to map every
  allocation ≥ 64 KiB freshly, so reused heap pages cannot hide one.

Goals: topk_divergence ≤ 0.6× the eager reference's time, ≤ 1/4 of its peak extra memory, and
against the compiled reference ≤ 1.0× its time for float32 logits, ≤ 1.15× for bfloat16. The
inputs are random logits (flat rows), where topk_divergence takes its compiled one-pass kernel
(trustlens.divergence.vocab_chunks.COMPILE_MIN_ELEMENTS); its compile step runs in the warm-up call.

Record's CPU path (`--only record`, also in the default run): `logit_quantities` on the same
logits with μ's top-K at τ = 1 (entropy, top-K TV/KL and masses) against τ = 0.7, which also
gives pi_logp_raw (log π(a_t) before the temperature, one more exp-and-sum pass per chunk): the
ratio is that column's cost on the CPU (on CUDA it shares the logit pass's single read).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from trustlens.divergence import exact_divergence, topk_divergence, topk_from_logits
from trustlens.record.logit_quantities import logit_quantities

# glibc: serve every allocation ≥ 64 KiB from fresh pages, so RSS growth sees it even when
# earlier freed heap memory could have been reused.
FRESH_PAGES = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
TOPK_VARIANTS = ("topk_ref_eager", "topk_ref_compiled", "topk_divergence")
EXACT_VARIANTS = ("exact_ref_eager", "exact_ref_compiled", "exact_divergence")


def topk_reference(pi_logits: torch.Tensor, ids: torch.Tensor, mu_logp: torch.Tensor):
    """The reference form: full float32 log-softmax, gather, masses clamped at 1e-12."""
    log_pi = torch.log_softmax(pi_logits.float(), dim=-1)  # (N, V): the copy topk_divergence avoids
    pi_logp = log_pi.gather(-1, ids)
    mu_logp = mu_logp.float()
    pi_p, mu_p = pi_logp.exp(), mu_logp.exp()
    pi_rest = (1.0 - pi_p.sum(-1)).clamp(min=1e-12)
    mu_rest = (1.0 - mu_p.sum(-1)).clamp(min=1e-12)
    kl = (mu_p * (mu_logp - pi_logp)).sum(-1) + mu_rest * (mu_rest.log() - pi_rest.log())
    tv = 0.5 * ((mu_p - pi_p).abs().sum(-1) + (mu_rest - pi_rest).abs())
    return tv, kl


def exact_reference(pi_logits: torch.Tensor, mu_logits: torch.Tensor):
    """The two-log-softmax form of the exact TV and KL(μ ‖ π)."""
    log_pi = torch.log_softmax(pi_logits.float(), dim=-1)
    log_mu = torch.log_softmax(mu_logits.float(), dim=-1)
    mu = log_mu.exp()
    return 0.5 * (mu - log_pi.exp()).abs().sum(-1), (mu * (log_mu - log_pi)).sum(-1)


def make_inputs(n: int, vocab: int, k: int, dtype: torch.dtype, exact: bool):
    """Seeded inputs: π logits (n, V) and either μ's top-K record or μ's logits."""
    gen = torch.Generator().manual_seed(0)
    pi = torch.randn(n, vocab, generator=gen).mul_(2.0)
    mu = pi + torch.randn(n, vocab, generator=gen).mul_(0.3)
    pi = pi.to(dtype)
    if exact:
        return pi, mu.to(dtype)
    sampled = torch.distributions.Categorical(logits=mu[:, :4096]).sample()  # any valid id
    ids, logp = topk_from_logits(mu, sampled, k)
    return pi, ids, logp


def function(variant: str) -> Callable:
    """The callable of one variant; the compiled ones compile on their first call."""
    reference = exact_reference if variant.startswith("exact") else topk_reference
    if variant.endswith("_ref_eager"):
        return reference
    if variant.endswith("_ref_compiled"):
        return torch.compile(reference, fullgraph=True)
    return {"topk_divergence": topk_divergence, "exact_divergence": exact_divergence}[variant]


def _kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", open("/proc/self/status").read()).group(1))


def peak_extra_mib(fn: Callable, *inputs) -> float:
    """Peak RSS growth (MiB) during one call fn(*inputs), after a warm-up call (Linux)."""
    with torch.no_grad():
        fn(*inputs)
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        base = _kib("VmRSS")
        fn(*inputs)
        return (_kib("VmHWM") - base) / 1024


def measure_memory(variant: str, n: int, vocab: int, k: int, dtype: torch.dtype) -> float:
    """`peak_extra_mib` of one variant on the benchmark inputs; run in a fresh process."""
    inputs = make_inputs(n, vocab, k, dtype, variant.startswith("exact"))
    return peak_extra_mib(function(variant), *inputs)


def measure_times(variants, n, vocab, k, dtype, reps: int) -> dict[str, float]:
    """Median time (ms) per variant, calls interleaved across variants on the same inputs."""
    fns = {v: function(v) for v in variants}
    inputs = make_inputs(n, vocab, k, dtype, variants[0].startswith("exact"))
    times: dict[str, list[float]] = {v: [] for v in variants}
    with torch.no_grad():
        for v in variants:  # warm-up and compile
            fns[v](*inputs)
        for _ in range(reps):
            for v in variants:
                start = time.perf_counter()
                fns[v](*inputs)
                times[v].append((time.perf_counter() - start) * 1e3)
    return {v: statistics.median(t) for v, t in times.items()}


def record_times(n: int, vocab: int, k: int, dtype: torch.dtype, reps: int) -> dict[float, float]:
    """Median time (ms) of `logit_quantities` per temperature (1 and 0.7), calls interleaved,
    on the top-K inputs seen as one (1, n) batch."""
    pi, ids, logp = make_inputs(n, vocab, k, dtype, False)
    args = (pi[None], torch.ones(1, n, dtype=torch.bool), ids[None, :, -1], ids[None], logp[None], None)
    times: dict[float, list[float]] = {1.0: [], 0.7: []}
    with torch.no_grad():
        for rep in range(reps + 1):  # the first round warms up
            for tau, spent in times.items():
                start = time.perf_counter()
                logit_quantities(*args, tau, want_entropy=True)
                if rep:
                    spent.append((time.perf_counter() - start) * 1e3)
    return {tau: statistics.median(t) for tau, t in times.items()}


def table(variants, times, mem, baseline: str) -> str:
    """Rows of median time, peak extra memory and ratios against the eager reference."""
    head = ("variant", "median ms", "peak extra MiB", "time / eager", "mem / eager")
    lines = ["{:<20}{:>11}{:>16}{:>14}{:>13}".format(*head)]
    for v in variants:
        lines.append(
            f"{v:<20}{times[v]:>11.1f}{mem[v]:>16.1f}{times[v] / times[baseline]:>14.3f}{mem[v] / mem[baseline]:>13.4f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1024, help="positions (rows)")
    parser.add_argument("--vocab", type=int, default=151_936, help="vocabulary size V")
    parser.add_argument("--k", type=int, default=20, help="top-K size")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--reps", type=int, default=7, help="timed calls per variant")
    parser.add_argument("--only", choices=["topk", "exact", "record"], help="benchmark one function only")
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)  # internal: one variant's memory
    args = parser.parse_args()
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    shape = (args.n, args.vocab, args.k, dtype)
    if args.memory_of:
        print(json.dumps(measure_memory(args.memory_of, *shape)))
        return

    print(f"N = {args.n}, V = {args.vocab}, K = {args.k}, logits {args.dtype}, 1 thread, torch {torch.__version__}")
    if args.only in (None, "record"):
        rec = record_times(*shape, reps=args.reps)
        print(
            f"\nrecord's logit_quantities: τ = 1 {rec[1.0]:.1f} ms, τ = 0.7 (+ pi_logp_raw) {rec[0.7]:.1f} ms: "
            f"{rec[0.7] / rec[1.0]:.3f}×"
        )
    for variants, goals in ((TOPK_VARIANTS, True), (EXACT_VARIANTS, False)):
        if args.only and not variants[0].startswith(args.only):
            continue
        mem = {}
        for v in variants:
            cmd = [
                sys.executable,
                __file__,
                "--memory-of",
                v,
                "--n",
                str(args.n),
                "--vocab",
                str(args.vocab),
                "--k",
                str(args.k),
                "--dtype",
                args.dtype,
            ]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=FRESH_PAGES)
            out = out.stdout
            mem[v] = json.loads(out)
        times = measure_times(variants, *shape, reps=args.reps)
        print()
        print(table(variants, times, mem, variants[0]))
        ours, eager, compiled = variants[2], variants[0], variants[1]
        print(
            f"{ours}: time {times[ours] / times[eager]:.3f}× eager, "
            f"{times[ours] / times[compiled]:.3f}× compiled; "
            f"memory {mem[ours] / mem[eager]:.4f}× eager"
        )
        if goals:
            bound = 1.0 if dtype == torch.float32 else 1.15
            met = (
                times[ours] <= 0.6 * times[eager],
                times[ours] <= bound * times[compiled],
                mem[ours] <= mem[eager] / 4,
            )
            print(
                f"goals (≤ 0.6× eager time, ≤ {bound:g}× compiled time, ≤ 1/4 eager memory): "
                + ", ".join("met" if m else "MISSED" for m in met)
            )


if __name__ == "__main__":
    main()
