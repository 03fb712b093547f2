"""Process-group helpers that also work with no process group at all.

Everything here runs unchanged in one plain Python process: ``rank()`` is 0 and
``world_size()`` is 1 when ``torch.distributed`` is not initialised, and the gathers return
their input.

Why a hand-written all-gather: ``accelerator.gather`` (and ``torch.distributed.all_gather``)
return tensors that carry no gradient, so a loss that compares local anchors with the
embeddings of every process would only train on its local half of each pair
(lightly#1528, solo-learn PR#232). :func:`gather_with_grad` is differentiable: its backward
sums the incoming gradient over processes and returns this process's slice.

Gradient convention. Each process computes the loss of its *local* anchors against the
*global* candidates, averaged over its local anchors. DDP then averages parameter gradients
over processes, which is exactly the gradient of the 1-process loss on the whole batch.
Measured directly on the embeddings, a process's gradient is ``world_size`` times the
1-process gradient of its slice (DDP's average divides that factor out again).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    """True when a process group with more than one process is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank, 0 without a process group."""
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    """Number of processes, 1 without a process group."""
    return dist.get_world_size() if is_distributed() else 1


class _GatherWithGrad(torch.autograd.Function):
    """All-gather whose backward all-reduces (sums) the gradient and keeps the local slice."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
        gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, tensor.contiguous())
        return tuple(gathered)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> torch.Tensor:
        stacked = torch.stack(grads)  # (W, *shape)
        # Every process's loss depends on our slice: sum their gradients for it.
        dist.all_reduce(stacked, op=dist.ReduceOp.SUM)
        return stacked[dist.get_rank()]


def gather_with_grad(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate ``tensor`` from every process along dim 0, keeping the gradient.

    Shape:
        tensor: (n, ...) on every process (the same n everywhere).
        returns: (world_size * n, ...), process r's rows at ``r * n : (r + 1) * n``.
    """
    if not is_distributed():
        return tensor
    return torch.cat(_GatherWithGrad.apply(tensor), dim=0)


@torch.no_grad()
def gather_no_grad(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate ``tensor`` from every process along dim 0, detached (labels, queue keys)."""
    if not is_distributed():
        return tensor
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, tensor.contiguous())
    return torch.cat(gathered, dim=0)


def local_offset(local_batch: int) -> int:
    """Row of this process's first sample in a gathered tensor: ``rank * local_batch``."""
    return rank() * local_batch
