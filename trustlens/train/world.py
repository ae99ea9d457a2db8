"""Data parallelism of the built-in trainer: gloo on CPU, one process per rank, started by
torchrun. In a single process every function here is a no-op (or the world of one rank)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int  # this process's rank
    size: int  # number of processes

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_world() -> World:
    """The process group from torchrun's environment (gloo), or a single process."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size > 1 and not dist.is_initialized():
        dist.init_process_group("gloo")
    if dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size())
    return World(0, 1)


def all_reduce_(t: torch.Tensor, op: str = "mean") -> torch.Tensor:
    """In place across ranks: "mean", "sum" or "max". A no-op in a single process."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        if op == "mean":
            t /= dist.get_world_size()
    return t


def average_gradients(params: list[torch.nn.Parameter]) -> None:
    """Average the gradients over ranks with one flat all-reduce."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return
    grads = [p.grad for p in params if p.grad is not None]
    flat = all_reduce_(torch.cat([g.reshape(-1) for g in grads]))
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


__all__ = ["World", "all_reduce_", "average_gradients", "init_world"]
