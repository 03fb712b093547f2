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

import os

import torch
import torch.distributed as dist


def cpu_processes_launched() -> bool:
    """Whether this process is one of several started for the CPU, so that Accelerate must be told ``cpu=True``.

    ``accelerate launch --cpu`` says so itself (``ACCELERATE_USE_CPU``). torchrun, srun or a batch script
    only set the ranks (``WORLD_SIZE``, ``LOCAL_RANK``), and on a machine without CUDA Accelerate then
    takes each process for a run of its own: N runs writing one run directory at once.
    """
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true"):
        return True
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1 or "LOCAL_RANK" in os.environ
    return launched and not torch.cuda.is_available()


def is_distributed() -> bool:
    """True when a process group with more than one process is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank, 0 without a process group."""
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    """Number of processes, 1 without a process group."""
    return dist.get_world_size() if is_distributed() else 1


def check_same_rows(tensor: torch.Tensor) -> None:
    """Raise ``ValueError`` on every process unless all of them hold the same number of rows.

    The gathers below, and the rank offsets of the positives (:func:`local_offset`), assume the
    same ``n`` everywhere; with another ``n`` on one process (a last partial batch from a loader
    without ``drop_last``) gloo aborts the process and NCCL may hang. One all-gather of one
    number makes that a readable error instead, raised by all processes alike (they all see the
    same sizes). It is one more collective (about 1.4 ms with gloo on two CPU processes, a host
    sync on a GPU), so a loss checks its first gather only and passes ``check=False`` to the
    gathers of the same call whose size follows from it (the other view, the labels, counts).
    """
    count = torch.tensor([tensor.shape[0] if tensor.dim() else 1], device=tensor.device)  # a 0-d tensor is one row
    counts = [torch.empty_like(count) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, count)
    sizes = torch.cat(counts).tolist()
    if len(set(sizes)) > 1:
        raise ValueError(
            f"batch sizes differ across processes {tuple(sizes)}: a loss that gathers embeddings needs the same "
            f"number of samples on every process; drop the last partial batch (DataLoader(drop_last=True)) "
            f"or pass gather_distributed=False"
        )


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


def gather_with_grad(tensor: torch.Tensor, check: bool = True) -> torch.Tensor:
    """Concatenate ``tensor`` from every process along dim 0, keeping the gradient.

    Shape:
        tensor: (n, ...) on every process (the same n everywhere: :func:`check_same_rows`).
        returns: (world_size * n, ...), process r's rows at ``r * n : (r + 1) * n``.
    """
    if not is_distributed():
        return tensor
    if check:  # False: the caller has checked a tensor with the same rows in this call
        check_same_rows(tensor)
    return torch.cat(_GatherWithGrad.apply(tensor), dim=0)


@torch.no_grad()
def gather_no_grad(tensor: torch.Tensor, check: bool = True) -> torch.Tensor:
    """Concatenate ``tensor`` from every process along dim 0, detached (labels, queue keys).
    ``check=False`` skips :func:`check_same_rows` (sizes already checked, or fixed: a count)."""
    if not is_distributed():
        return tensor
    if check:
        check_same_rows(tensor)
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, tensor.contiguous())
    return torch.cat(gathered, dim=0)


def local_offset(local_batch: int) -> int:
    """Row of this process's first sample in a gathered tensor: ``rank * local_batch``."""
    return rank() * local_batch


def skip_broadcast_of_replicated_buffers(model: torch.nn.Module) -> list[str]:
    """Tell DDP not to re-send the buffers that every process already holds identically.

    DDP with ``broadcast_buffers=True`` (the default, and Accelerate's) copies *every* buffer of
    the model from rank 0 to the others before each forward: right for BatchNorm's running
    statistics, which each process computes from its own batch, wasted on state that every
    process updates from gathered data and so keeps equal by construction: MoCo's key queue
    (65,536 x 128 fp32 = 32 MiB, 15 ms a step over gloo between two CPU processes) and NPID's
    memory bank (one row per training image: 655 MiB a step on ImageNet). A module lists such
    buffers by name in a ``replicated_buffers`` class attribute; this collects their full names
    and hands them to DDP's documented workaround for ignoring parameters and buffers
    (``DistributedDataParallel._set_params_and_buffers_to_ignore_for_model``, pytorch#43690).
    Call it before the model is wrapped (``accelerator.prepare``). Ignored buffers also skip
    DDP's initial rank-0 broadcast, so they must start equal: zeros, or drawn from a fixed seed.

    The same list carries the parameters that each process holds *differently*, which DDP must
    neither broadcast from rank 0 nor average: a Partial FC head's block of class centres
    (:mod:`sslkit.losses.partial_fc`), named in the module's ``sharded_parameters``. (DDP keeps
    one such list per model, so both kinds go in one call.)

    Returns the names, ``[]`` when no module declares any (the model is then left as it was).
    """
    names = [
        f"{prefix}.{name}" if prefix else name
        for prefix, module in model.named_modules()
        for name in (*getattr(type(module), "replicated_buffers", ()), *getattr(module, "sharded_parameters", ()))
    ]
    if names:
        torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
    return names


def broadcast_buffers(model: torch.nn.Module) -> None:
    """Give every process rank 0's buffers (BatchNorm's running statistics) before evaluating.

    Under DDP each process's last forward updates its own running statistics after DDP's rank-0
    broadcast, so after training they differ by process. Rank 0's are the ones a checkpoint
    saves and a run exports; without this, each process would evaluate its share of the test
    set with other statistics. The ``replicated_buffers`` are equal by construction and skipped.
    """
    if not is_distributed():
        return
    skip = {
        f"{prefix}.{buffer}" if prefix else buffer
        for prefix, module in model.named_modules()
        for buffer in getattr(type(module), "replicated_buffers", ())
    }
    for name, buffer in model.named_buffers():
        if name not in skip:
            dist.broadcast(buffer, src=0)


def all_reduce(tensor: torch.Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM) -> torch.Tensor:
    """``op`` (a sum by default) of ``tensor`` over processes, returned on ``tensor``'s device; ``tensor``
    itself without a process group. The input is left unchanged.

    NCCL reduces CUDA tensors only, and evaluation keeps its features (and so its sums) on the CPU:
    under NCCL the reduction goes through the current CUDA device and comes back.
    """
    if not is_distributed():
        return tensor
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else tensor.device
    reduced = tensor.to(device, copy=True)
    dist.all_reduce(reduced, op=op)
    return reduced.to(tensor.device)
