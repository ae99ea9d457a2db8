"""A hand-written PyTorch RL loop with trustlens attached: the lines marked `# trustlens` are all
it takes.

The loop is GRPO with PPO's clipped surrogate on a toy task: prompts are two numbers, and the
reward is the share of even numbers among the words of the response. The policy is a tiny Llama
built from scratch; it samples token by token at temperature τ, keeping the sampling
log-probabilities (μ) and μ's top-K, recomputes π_old before the updates, and takes `--updates`
full-batch optimizer steps per rollout batch, so that π moves away from μ. Every update is
recorded with every trust-region rule evaluated counterfactually.

    python examples/plain_loop.py --out runs/plain --steps 30

Launched by torchrun it trains data-parallel (DistributedDataParallel over gloo): each rank
samples its own prompts and records its own shard of the same run directory, with no change to
the trustlens lines (the recorder takes the rank from torch.distributed).

    python -m torch.distributed.run --nproc_per_node 2 examples/plain_loop.py --out runs/plain_ddp
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.nn.parallel import DistributedDataParallel

from trustlens import TokenRecorder  # trustlens
from trustlens.divergence import topk_from_logits  # trustlens
from trustlens.train.model import ModelConfig, build_model, build_tokenizer


def response_logits(model, ids: torch.Tensor, prompt_len: int, temperature: float) -> torch.Tensor:
    """The logits that predict the response tokens, divided by τ: (B, T, V)."""
    return model(input_ids=ids).logits[:, prompt_len - 1 : -1].float() / temperature


@torch.no_grad()
def sample(model, prompts: torch.Tensor, max_new: int, temperature: float, eos: int, topk: int):
    """Sample responses token by token; returns (ids (B, P+T), response mask (B, T), log μ (B, T),
    μ's top-K ids and log-probs (B, T, K)). Tokens after eos are masked out."""
    ids, alive, mu, top_ids, top_logp = prompts, [], [], [], []
    done = torch.zeros(len(prompts), dtype=torch.bool)
    for _ in range(max_new):
        logits = model(input_ids=ids).logits[:, -1].float() / temperature  # (B, V)
        logp = torch.log_softmax(logits, -1)
        sampled = torch.multinomial(logp.exp(), 1).squeeze(1)
        k_ids, k_logp = topk_from_logits(logits, sampled, topk)  # trustlens
        alive.append(~done)
        mu.append(logp.gather(1, sampled[:, None]).squeeze(1))
        top_ids.append(k_ids)
        top_logp.append(k_logp)
        ids = torch.cat([ids, sampled[:, None]], 1)
        done = done | (sampled == eos)
        if bool(done.all()):
            break
    stack = lambda xs: torch.stack(xs, 1)  # noqa: E731
    return ids, stack(alive), stack(mu), stack(top_ids), stack(top_logp)


def even_share(text: str) -> float:
    """The reward: the share of even numbers among the words of the response."""
    words = text.split()
    return sum(w.isdigit() and int(w) % 2 == 0 for w in words) / max(len(words), 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="run directory to create")
    p.add_argument("--steps", type=int, default=30, help="rollout batches")
    p.add_argument("--prompts", type=int, default=8, help="prompts per batch")
    p.add_argument("--group", type=int, default=4, help="responses per prompt (GRPO group size)")
    p.add_argument("--updates", type=int, default=2, help="optimizer steps per rollout batch")
    p.add_argument("--max-new", type=int, default=8, help="longest response, in tokens")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature τ")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    p.add_argument("--clip", type=float, default=0.2, help="PPO clip range ε")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    args = p.parse_args()
    distributed = "RANK" in os.environ  # launched by torchrun
    if distributed:
        torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank() if distributed else 0
    torch.manual_seed(args.seed + rank)  # each rank its own prompts and samples
    torch.set_num_threads(1)

    tok = build_tokenizer(max_number=99)
    cfg = ModelConfig(vocab_size=len(tok), hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
    model = build_model(cfg, seed=args.seed).train()  # the same initial weights on every rank
    ddp = DistributedDataParallel(model) if distributed else model  # averages gradients over ranks
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    with TokenRecorder(args.out, tokenizer=tok, active_rule="ppo", config=vars(args)) as rec:  # trustlens
        for step in range(args.steps):
            numbers = torch.randint(0, 100, (args.prompts, 2)).repeat_interleave(args.group, 0)
            prompts = torch.tensor([tok(f"{a} {b}")["input_ids"] for a, b in numbers.tolist()])
            P = prompts.shape[1]
            ids, mask, mu, mu_top_ids, mu_top_logp = sample(
                model, prompts, args.max_new, args.temperature, tok.eos_token_id, topk=20
            )
            response, groups = ids[:, P:], torch.arange(len(ids)) // args.group  # (B, T), (B,)
            texts = tok.batch_decode(response * mask, skip_special_tokens=True)
            rewards = torch.tensor([even_share(t) for t in texts])
            grouped = rewards.view(-1, args.group)
            adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)
            with torch.no_grad():
                old = torch.log_softmax(response_logits(model, ids, P, args.temperature), -1)
                old = old.gather(-1, response[..., None]).squeeze(-1)
            for update in range(args.updates):
                logits = response_logits(ddp, ids, P, args.temperature)  # (B, T, V)
                pi = torch.log_softmax(logits, -1).gather(-1, response[..., None]).squeeze(-1)
                ratio = torch.exp(pi - mu)
                surrogate = torch.min(ratio * adv[:, None], ratio.clamp(1 - args.clip, 1 + args.clip) * adv[:, None])
                loss = -(surrogate * mask).sum() / mask.sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
                # fmt: off
                rec.record(step, update=update, token_ids=response, response_mask=mask,  # trustlens
                           pi_logp=pi, mu_logp=mu, old_logp=old, advantages=adv, group_ids=groups,  # trustlens
                           logits=logits, mu_topk_ids=mu_top_ids, mu_topk_logp=mu_top_logp)  # trustlens
                # fmt: on
            prompt_texts = tok.batch_decode(prompts, skip_special_tokens=True)
            # fmt: off
            rec.log_samples(step, prompts=prompt_texts, responses=texts, rewards=rewards,  # trustlens
                            advantages=adv, lengths=mask.sum(1), group_ids=groups)  # trustlens
            # fmt: on
            rec.log_metrics(step, {"reward/mean": rewards.mean(), "loss": loss.detach()})  # trustlens
            print(f"rank {rank} step {step}: reward {rewards.mean():.3f}")
    if distributed:
        torch.distributed.destroy_process_group()
    print(f"recorded {args.out}")


if __name__ == "__main__":
    main()
