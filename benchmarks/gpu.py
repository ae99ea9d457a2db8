"""Benchmark: trustlens on a CUDA GPU (skips cleanly, exit 0, without one).

    python benchmarks/gpu.py [--n 8192] [--vocab 151936] [--k 20] [--reps 20] [--steps 10] [--check]

1. The logit pass (trustlens.divergence.kernels: the Triton kernel, and its torch fallback) against
   the top-K reference forms of benchmarks/divergence.py (a full float32 log_softmax, a gather and
   the bucket sums; eager and under torch.compile) and a plain `amax` over the logits (the floor:
   one read), for float32 and bfloat16 logits (N, V) with K ids per row: median time over --reps
   calls, variants interleaved call by call, CUDA events; GB/s of logits read; ratios against the
   compiled reference. Goal on an H100 for 8,192 × 151,936 bfloat16: ≤ 1.2 ms, ≥ 2 TB/s, ≥ 1.6×
   faster than the compiled reference.
   The exact pass (exact TV and KL(μ ‖ π) over the vocabulary from π's and μ's logits; it reads
   both rows twice, and its TB/s count all four reads) against the two-log-softmax reference of
   benchmarks/divergence.py, eager and compiled, same shapes.
2. The training-step overhead of `record` on a Qwen2.5-0.5B-shaped model (random init from
   transformers' Qwen2Config, bfloat16, B = 8, T = 1024, AdamW, gradient checkpointing), steps
   interleaved over --steps rounds: no recorder / `record` without logits / `record` with logits
   and μ's top-K. Goals: ≤ 1 % and ≤ 2 % over the step without recording.
3. The peak extra GPU memory of one `record` call with logits and top-K (torch's allocator peak
   over what was allocated before the call). Goal: ≤ 256 MiB. And the host synchronisations of
   one such call, counted by torch.cuda.set_sync_debug_mode("warn") in the caller's thread
   after a warm-up call. Goal: ≤ 1.
4. --check: the rows of a small recording made from CUDA tensors equal those made from the same
   tensors on the CPU (log-probabilities and divergences within 1e-6, entropy within 1e-5
   relative). Exit status 1 when they do not.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from divergence import exact_reference, topk_reference  # benchmarks/divergence.py

from trustlens import TokenRecorder, load_run
from trustlens.divergence import kernels


def cuda_ms(fn, reps: int) -> list[float]:
    """Times of `reps` calls of fn in ms, each between CUDA events."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def interleaved(variants: dict, reps: int) -> dict[str, float]:
    """Median ms per variant, one call of each in turn per round, after a warm-up call each."""
    for fn in variants.values():
        fn()
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(reps):
        for name, fn in variants.items():
            times[name] += cuda_ms(fn, 1)
    return {name: statistics.median(t) for name, t in times.items()}


def pass_variants(logits, ids, mu_logp, k: int, compiled_reference) -> dict:
    """The timed calls of part 1 on one input."""
    starts = kernels.row_starts(logits)
    variants = {
        "amax (one read)": lambda: logits.amax(-1),
        "logit pass (triton)": lambda: kernels.run_pass(logits, starts, ids, k, 1.0, "triton"),
        "logit pass (torch fallback)": lambda: kernels.run_pass(logits, starts, ids, k, 1.0, "torch"),
        "reference, eager": lambda: topk_reference(logits, ids, mu_logp),
        "reference, compiled": lambda: compiled_reference(logits, ids, mu_logp),
    }
    if not kernels.triton_available():
        del variants["logit pass (triton)"]
    return variants


def logit_pass_bench(n: int, vocab: int, k: int, reps: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    compiled_reference = torch.compile(topk_reference)
    for dtype in (torch.float32, torch.bfloat16):
        logits = (torch.randn(n, vocab, device="cuda", generator=gen) * 2).to(dtype)
        ids = torch.stack([torch.randperm(vocab, device="cuda", generator=gen)[:k] for _ in range(n)])
        mu_logp = torch.full((n, k), -6.0, device="cuda")
        variants = pass_variants(logits, ids, mu_logp, k, compiled_reference)
        ms = interleaved(variants, reps)
        gb = logits.numel() * logits.element_size() / 1e9
        print(f"\nlogit pass, {dtype}, N = {n}, V = {vocab}, K = {k} ({gb:.2f} GB of logits), median of {reps}:")
        for name, t in ms.items():
            ratio = ms["reference, compiled"] / t
            print(f"  {name:30s} {t:8.3f} ms  {gb / t:6.2f} TB/s  {ratio:5.2f}× the compiled reference's speed")
        del logits, ids


def exact_pass_bench(n: int, vocab: int, reps: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(1)
    compiled_reference = torch.compile(exact_reference)
    for dtype in (torch.float32, torch.bfloat16):
        pi = (torch.randn(n, vocab, device="cuda", generator=gen) * 2).to(dtype)
        mu = (pi.float() + 0.3 * torch.randn(n, vocab, device="cuda", generator=gen)).to(dtype)
        variants = {
            "amax of both (one read)": lambda pi=pi, mu=mu: (pi.amax(-1), mu.amax(-1)),
            "exact pass (triton)": lambda pi=pi, mu=mu: kernels.run_exact(pi, mu, 1.0, "triton"),
            "exact pass (torch fallback)": lambda pi=pi, mu=mu: kernels.run_exact(pi, mu, 1.0, "torch"),
            "reference, eager": lambda pi=pi, mu=mu: exact_reference(pi, mu),
            "reference, compiled": lambda pi=pi, mu=mu: compiled_reference(pi, mu),
        }
        if not kernels.triton_available():
            del variants["exact pass (triton)"]
        ms = interleaved(variants, reps)
        gb = 2 * pi.numel() * pi.element_size() / 1e9  # both tensors, once
        print(f"\nexact pass, {dtype}, N = {n}, V = {vocab} ({gb:.2f} GB of logits), median of {reps}:")
        for name, t in ms.items():
            reads = 2 if name.startswith("exact pass") else 1  # the pass reads both rows twice
            ratio = ms["reference, compiled"] / t
            speed = f"{reads * gb / t:6.2f} TB/s read  {ratio:5.2f}× the compiled reference's speed"
            print(f"  {name:30s} {t:8.3f} ms  {speed}")
        del pi, mu


def model_and_batch(b: int, t: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(  # Qwen2.5-0.5B's shape
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to("cuda", torch.bfloat16)
    model.gradient_checkpointing_enable()
    model.train()
    ids = torch.randint(0, config.vocab_size, (b, t), device="cuda")
    return model, torch.optim.AdamW(model.parameters(), lr=1e-6), ids


def record_inputs(logits: torch.Tensor, targets: torch.Tensor, k: int) -> dict:
    """μ's side as a rollout engine would give it: log μ(a_t) near π's, and a top-K set holding a_t."""
    b, t, vocab = logits.shape
    spread = 1 + 7919 * torch.arange(k - 1, device="cuda")  # distinct offsets, none ≡ 0 (mod V)
    topk_ids = torch.cat([targets[..., None], (targets[..., None] + spread) % vocab], -1)  # (B, T, K), a_t first
    return {
        "mu_topk_ids": topk_ids,
        "mu_topk_logp": torch.full((b, t, k), -4.0, device="cuda"),
        "advantages": torch.randn(b, device="cuda"),
    }


def step_overhead(steps: int, k: int, b: int = 8, t: int = 1024) -> None:
    model, optim, ids = model_and_batch(b, t)
    targets = ids[:, 1:]
    mask = torch.ones_like(targets, dtype=torch.bool)
    extra = None

    def step(recorder, with_logits: bool, step_no: int) -> None:
        nonlocal extra
        out = model(ids).logits[:, :-1]  # (B, T−1, V) bf16
        logp = torch.log_softmax(out.float(), -1).gather(-1, targets[..., None])[..., 0]
        if extra is None:
            extra = record_inputs(out, targets, k)
        loss = -(logp * extra["advantages"][:, None]).mean()
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        if recorder is not None:
            given = dict(token_ids=targets, response_mask=mask, pi_logp=logp.detach())
            given.update(mu_logp=(logp.detach() - 0.01).clamp(max=0.0), advantages=extra["advantages"])
            if with_logits:
                given.update(logits=out.detach(), mu_topk_ids=extra["mu_topk_ids"], mu_topk_logp=extra["mu_topk_logp"])
            recorder.record(step_no, **given)
        torch.cuda.synchronize()

    with tempfile.TemporaryDirectory() as tmp:
        recorders = {
            "no recorder": None,
            "record without logits": TokenRecorder(Path(tmp) / "plain", rules=["ppo", "dppo_binary_tv"]),
            "record with logits + top-K": TokenRecorder(Path(tmp) / "logits"),
        }
        times: dict[str, list[float]] = {name: [] for name in recorders}
        for i in range(steps + 2):  # two warm-up rounds (compilation, allocator)
            for name, rec in recorders.items():
                start = time.perf_counter()
                step(rec, name.endswith("top-K"), i)
                if i >= 2:
                    times[name].append((time.perf_counter() - start) * 1e3)
        base = statistics.median(times["no recorder"])
        print(f"\ntraining step, Qwen2.5-0.5B shape, bf16, B = {b}, T = {t}, median of {steps} interleaved rounds:")
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"  {name:30s} {med:8.1f} ms  {100 * (med / base - 1):+6.2f} %")
        peak_memory(recorders["record with logits + top-K"], model, ids, targets, mask, extra, steps + 2)
        for rec in recorders.values():
            if rec is not None:
                rec.close()


def peak_memory(recorder, model, ids, targets, mask, extra, step_no: int) -> None:
    with torch.no_grad():
        out = model(ids).logits[:, :-1]
        logp = torch.log_softmax(out.float(), -1).gather(-1, targets[..., None])[..., 0]
    torch.cuda.synchronize()
    given = dict(
        token_ids=targets,
        response_mask=mask,
        pi_logp=logp,
        mu_logp=(logp - 0.01).clamp(max=0.0),
        advantages=extra["advantages"],
        logits=out,
        mu_topk_ids=extra["mu_topk_ids"],
        mu_topk_logp=extra["mu_topk_logp"],
    )
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    recorder.record(step_no, **given)
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - before) / 2**20
    print(f"\npeak extra GPU memory of one record call with logits + top-K: {peak:.1f} MiB (goal ≤ 256 MiB)")
    syncs = host_syncs(lambda: recorder.record(step_no + 1, **given))
    print(f"host synchronisations in one record call with logits + top-K: {len(syncs)} (goal ≤ 1)")
    for message in syncs:
        print(f"  {message}")


def host_syncs(call) -> list[str]:
    """The synchronising CUDA calls torch reports while `call` runs (set_sync_debug_mode "warn"),
    in this thread: the writer thread's wait on its event is not a call of this thread's."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message).lower()]


def check_rows() -> bool:
    """The rows of one small recording from CUDA tensors against the same from CPU tensors."""
    gen = torch.Generator().manual_seed(0)
    b, t, vocab, k = 4, 33, 5003, 8
    logits = torch.randn(b, t + 1, vocab, generator=gen) * 3
    logits[..., :50] = -torch.inf
    ids = torch.randint(50, vocab, (b, t), generator=gen)
    log_mu = torch.log_softmax(logits[:, :-1] + torch.randn(b, t, vocab, generator=gen), -1)
    topk_ids = log_mu.topk(k, -1).indices
    given = dict(
        token_ids=ids,
        response_mask=torch.rand(b, t, generator=gen) > 0.2,
        pi_logp=torch.log_softmax(logits[:, :-1] / 0.9, -1).gather(-1, ids[..., None])[..., 0],
        mu_logp=log_mu.gather(-1, ids[..., None])[..., 0],
        advantages=torch.randn(b, generator=gen),
        logits=logits[:, :-1],  # a strided view
        mu_topk_ids=topk_ids,
        mu_topk_logp=log_mu.gather(-1, topk_ids),
        temperature=0.9,
    )
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for device in ("cpu", "cuda"):
            with TokenRecorder(Path(tmp) / device) as rec:
                rec.record(0, **{name: v.to(device) if isinstance(v, torch.Tensor) else v for name, v in given.items()})
            rows[device] = load_run(Path(tmp) / device).tokens.collect().sort("sample", "pos")
    ok = rows["cpu"].height == rows["cuda"].height
    for name in ("pi_logp", "mu_logp", "binary_tv", "binary_kl", "topk_tv", "topk_kl", "entropy"):
        cpu, cuda = (torch.tensor(rows[d][name].to_numpy(), dtype=torch.float64) for d in ("cpu", "cuda"))
        gap = (cpu - cuda).abs()
        if name == "entropy":
            gap = gap / cpu.abs().clamp(min=1e-12)
        bound = 1e-5 if name == "entropy" else 1e-6
        ok &= bool((gap <= bound).all())
        kind = "relative difference" if name == "entropy" else "difference"
        print(f"  {name:10s} max {kind} {float(gap.max()):.2e} (≤ {bound:g})")
    for name in ("dppo_topk_tv", "dppo_binary_tv", "ppo"):
        column = f"blocked_{name}"
        ok &= rows["cpu"][column].equals(rows["cuda"][column])
    print(f"--check: CUDA rows {'equal' if ok else 'DIFFER FROM'} the CPU rows ({rows['cpu'].height} rows)")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=8192, help="rows of the logit pass")
    parser.add_argument("--vocab", type=int, default=151936, help="vocabulary size")
    parser.add_argument("--k", type=int, default=20, help="μ's top-K ids per row")
    parser.add_argument("--reps", type=int, default=20, help="timed calls per variant of the logit pass")
    parser.add_argument("--steps", type=int, default=10, help="interleaved rounds of training steps")
    parser.add_argument("--check", action="store_true", help="only compare CUDA rows with CPU rows")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/gpu.py: no CUDA device here; skipped")
        return 0
    impl = kernels.pass_impl(torch.device("cuda"))
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, logit pass: {impl}")
    if args.check:
        return 0 if check_rows() else 1
    logit_pass_bench(args.n, args.vocab, args.k, args.reps)
    exact_pass_bench(args.n, args.vocab, args.reps)
    step_overhead(args.steps, args.k)
    return 0 if check_rows() else 1


if __name__ == "__main__":
    sys.exit(main())
