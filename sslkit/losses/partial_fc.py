"""Partial FC: a head's class centres sharded across processes, a sample of them per step.

At face-recognition sizes a head of 1,000,000 classes x 512 is 2 GB of weights, 2 GB of
gradient, 4 GB of AdamW moments and a (B, 1,000,000) logit matrix on every process. Partial FC
[0] keeps on each of the W processes a contiguous block of about C / W class centres (and so
their gradient and optimizer state), all-gathers the embeddings and labels, and computes the
margin softmax of the whole global batch against its own block only; the softmax's row max and
row sum are all-reduced across processes (a distributed cross-entropy), so the loss is the
full head's. Each step a process keeps only the *positive* centres of its block (the classes of
the global batch) and a random sample of the others, ``sample_rate`` x its block in all: the
(N, S) logits and the matmuls shrink by that factor.

Loss and gradients. With ``l_ij`` the scaled cosines, ``t_i`` the changed target logit,
``m_i = max_j l_ij`` and ``Z_i = sum_j exp(l_ij - m_i)`` over the sampled classes of *every*
process (both all-reduced)::

    loss = mean_i ( log Z_i + m_i - t_i )                       (the mean over the global batch)

Every process returns this same value. The gradient of a process's centres is exactly the
gradient of that loss (DDP must not average it: each process holds other centres, see
:func:`sslkit.distributed.skip_broadcast_of_replicated_buffers`); the gradient of the local
embeddings follows :mod:`sslkit.distributed`'s convention, ``world_size`` times the 1-process
gradient of the slice, which DDP's mean over processes divides out again. At
``sample_rate = 1`` every centre is kept and the loss and gradients are the full head's.

A centre left out of a step gets a zero gradient, but the optimizer still steps it (momentum,
weight decay), as in [0]'s implementation.

Checkpoints. :meth:`PartialFC.gather_rows` and :meth:`PartialFC.own_rows` turn a block into the
whole (C, D) matrix in class order and back: a head's ``state_dict`` holds the whole matrix
(gathered from every process, so every process must call it, as ``accelerator.save_state``
does), and loading takes this process's rows. :meth:`PartialFC.keep_optimizer_state_in_class_order`
does the same for the optimizer's per-centre state, and the ``state_dict`` also holds the
sampling's seed and step count (:meth:`PartialFC.sampling_state`), so that a resumed run samples
the centres the run never stopped would have. A run thus resumes on any number of processes
(the same processes, exactly) and exports like a head trained without Partial FC.

References:
    [0] Killing Two Birds with One Stone: Efficient and Robust Training of Face Recognition CNNs
        by Partial FC, An et al. 2022, https://arxiv.org/abs/2203.15565 (section 3; insightface's
        ``partial_fc_v2.py``)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from sslkit import distributed
from sslkit.losses._common import as_number, check_flag, full_precision, upcast
from sslkit.losses._workspace import Workspace
from sslkit.losses.head import check_positive_int
from sslkit.losses.margin_softmax import (
    _NORM_EPS,
    _cosines_in_workspace,
    _scaled_unit_rows,
    _TargetGraph,
)

# Rows initialised from one seeded generator each: the initial head in class order is then the
# same whatever the number of processes (each process draws only the blocks it holds).
_INIT_BLOCK = 4096


def partial_fc_repr(partial_fc: PartialFC | None) -> str:
    """A head's ``extra_repr`` tail: its ``partial_fc`` switch, and the sample rate when it is on."""
    return f", partial_fc=True, sample_rate={partial_fc.sample_rate}" if partial_fc else ", partial_fc=False"


def sharding_of(num_classes: int, partial_fc, sample_rate) -> PartialFC | None:
    """A head's ``partial_fc`` switch and ``sample_rate``, checked: the :class:`PartialFC` of its
    ``num_classes`` classes, or None without Partial FC.

    Raises:
        ValueError: a rate outside (0, 1], or a rate below 1 without ``partial_fc``.
    """
    partial_fc = check_flag(partial_fc, "partial_fc")
    rate = as_number(sample_rate, "sample_rate")
    if not 0 < rate <= 1:
        raise ValueError(f"sample_rate must be in (0, 1] (the share of class centres kept per step), got {rate}")
    if rate != 1 and not partial_fc:
        raise ValueError(f"sample_rate={rate} samples class centres only with partial_fc=True; set both or neither")
    return PartialFC(check_positive_int(num_classes, "num_classes"), rate) if partial_fc else None


def shard_bounds(num_classes: int, rank: int, world: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of the C classes that process ``rank`` of ``world`` holds: contiguous
    blocks in rank order, the first ``C mod W`` of them one row longer."""
    base, extra = divmod(num_classes, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def sample_centres(
    labels: torch.Tensor, start: int, stop: int, sample_rate: float, generator: torch.Generator
) -> torch.Tensor:
    """The rows of block ``[start, stop)`` kept this step: every class of ``labels`` in the block,
    then random others up to ``int(sample_rate * block)`` rows, at least one (all of the block at
    rate 1).

    Shape:
        labels: (N,) the global batch's class ids; returns (S,) sorted row indices into the block.
    """
    rows = stop - start
    if sample_rate >= 1:
        return torch.arange(rows, device=labels.device)
    here = labels[(labels >= start) & (labels < stop)] - start
    keep = max(int(sample_rate * rows), 1)  # one at least: no process scores an empty (N, 0) block
    # Random priorities in [0, 1), the positives' above them: the top `keep` are the positives
    # and a uniform sample of the rest (insightface's partial_fc_v2 samples the same way).
    priority = torch.rand(rows, generator=generator, device=generator.device).to(labels.device)
    priority[here] = 2.0
    keep = max(keep, int(torch.unique(here).numel()))
    return torch.topk(priority, keep, sorted=False).indices.sort().values


class _ScaleGradient(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by ``factor``."""

    @staticmethod
    def forward(ctx, tensor, factor):
        ctx.factor = factor
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def _all_reduce(tensor: torch.Tensor, op) -> torch.Tensor:
    if distributed.is_distributed():
        dist.all_reduce(tensor, op=op)
    return tensor


def _unit_weight_grad_in_place(grad: torch.Tensor, weight: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    """``grad_j - W_j <grad_j, W_j> / ||W_j||^2`` written into ``grad`` (rows with ``||W_j||`` <= eps
    keep theirs): the chain rule through ``W / ||W||`` for ``grad`` already divided by ``||W_j||``.

    The same as :func:`~sslkit.losses.margin_softmax._unit_weight_grad`, without its second
    (S, D) array: at Partial FC's sizes the block's gradient is a quarter of its memory with AdamW,
    and a reused buffer beside it (the full head's workspace) would be one more.

    Shape:
        grad, weight: (S, D); norm: (S,) unclamped. Returns ``grad``.
    """
    clamped = norm.clamp_min(_NORM_EPS).unsqueeze(1)  # (S, 1)
    # <grad_j, W_j> as S dot products (a batched matmul): vecdot would first build grad * W, (S, D).
    radial = torch.bmm(grad.unsqueeze(1), weight.unsqueeze(2)).squeeze(2)  # (S, 1)
    radial = radial.div_(clamped * clamped).masked_fill_((norm <= _NORM_EPS).unsqueeze(1), 0.0)
    return grad.addcmul_(weight, radial, value=-1.0)


class _ShardedMarginCE(torch.autograd.Function):
    """The margin-softmax loss of the global batch against this process's sampled centres,
    normalised over every process's: see :func:`sharded_margin_cross_entropy`.

    forward, with ``inv_j = 1 / ||W_j||`` and ``L = F W^T diag(inv)`` (N, S)::

        t_i = r target_logit(L_iy / r)   on the process holding y_i, all-reduced (a sum: 0 elsewhere)
        m_i = max over every process of L_ij (j != y_i) and t_i       (all-reduced max)
        E = exp(L - m), target entries 0;  Z_i = sum over processes of sum_j E_ij, + exp(t_i - m_i)
        loss = mean_i (log Z_i + m_i - t_i)

    backward, local to each process, with ``a_i = g / (N Z_i)`` and ``E'`` = E with the target
    entries set to ``b_i / a_i`` (``b_i`` = d loss / d L_iy through t_i), column-scaled by inv::

        dL/dF = a * (E' W);   dL/dW_j = K_j - W_j inv_j^2 <K_j, W_j>,  K = E'^T (a * F)

    as :class:`~sslkit.losses.margin_softmax._CosineMarginCE`, whose fp-range shortcuts it
    leaves out (the row max is all-reduced here anyway), and whose reused (C, D) buffer for the
    weight gradient it does without (:func:`_unit_weight_grad_in_place`).
    """

    @staticmethod
    def forward(ctx, features, weight, column, radius, target_logit, target_in_denominator, workspace):
        logits, norm, inv_norm = _cosines_in_workspace(features, weight, workspace)  # (N, S)
        n = features.shape[0]
        rows = (column >= 0).nonzero().squeeze(1)  # (R,) the samples whose class this process holds
        columns = column[rows]
        radius_t = torch.tensor(radius, dtype=logits.dtype, device=logits.device)
        graph = _TargetGraph(logits[rows, columns], radius_t, target_logit)
        target_here = graph.target.detach().to(logits.dtype)  # (R,)
        logits[rows, columns] = float("-inf")  # the target's exp is added from t below
        row_max = logits.amax(dim=1) if logits.shape[1] else logits.new_full((n,), float("-inf"))  # (N,)
        if target_in_denominator:
            row_max[rows] = torch.maximum(row_max[rows], target_here)
        shift = _all_reduce(row_max, dist.ReduceOp.MAX)  # (N,) one of the terms of Z_i: Z_i >= 1
        exp = logits.sub_(shift.unsqueeze(1)).exp_()  # (N, S) in the matmul's buffer
        sums = torch.zeros(2, n, dtype=logits.dtype, device=logits.device)
        torch.sum(exp, dim=1, out=sums[0])
        sums[1, rows] = target_here
        row_sum, target = _all_reduce(sums, dist.ReduceOp.SUM)  # (N,) each
        target_exp = (target - shift).exp_() if target_in_denominator else torch.zeros_like(target)
        row_sum = row_sum.add_(target_exp)  # (N,) Z_i
        loss = (row_sum.log() + shift - target).mean()
        ctx.save_for_backward(features, weight, norm, inv_norm, rows, columns, exp, row_sum, target_exp)
        ctx.graph, ctx.workspace = graph, workspace
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss):
        if getattr(ctx, "graph", None) is None:
            raise RuntimeError("the Partial FC loss supports one backward pass (retain_graph=True is not supported)")
        features, weight, norm, inv_norm, rows, columns, exp, row_sum, target_exp = ctx.saved_tensors
        graph, ctx.graph = ctx.graph, None
        row_scale = (grad_loss / exp.shape[0] / row_sum).unsqueeze(1)  # (N, 1) a_i
        grad_raw, _ = graph.grads(target_exp[rows] - row_sum[rows])  # (R,) b_i / a_i
        scaled = exp.mul_(inv_norm)  # (N, S) E diag(inv), in place: one backward only
        scaled[rows, columns] = grad_raw.to(scaled.dtype) * inv_norm[columns]
        grad_features = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_features = (scaled @ weight).mul_(row_scale)  # (N, D)
        if ctx.needs_input_grad[1]:
            grad_weight = _unit_weight_grad_in_place(scaled.T @ (features * row_scale), weight, norm)  # (S, D)
        ctx.workspace.give_back("logits", scaled)
        return grad_features, grad_weight, None, None, None, None, None


def sharded_margin_cross_entropy(
    features: torch.Tensor,
    weight: torch.Tensor,
    column: torch.Tensor,
    radius: float,
    target_logit: Callable[[torch.Tensor], torch.Tensor],
    target_in_denominator: bool = True,
    workspace: Workspace | None = None,
) -> torch.Tensor:
    """The margin-softmax cross-entropy of the global batch over the centres of every process.

    With ``U_j = W_j / ||W_j||`` over the centres that all processes pass together::

        logit_ij = features_i . U_j   for j != y_i;    logit_iy = r target_logit(features_i . U_y / r)
        loss = mean_i -log softmax(logit_i)[y_i]

    (``target_in_denominator=False``: the NCA form, the target left out of the softmax's sum.)
    Every process passes the same global ``features`` and its own centres; each returns the same
    loss, and gradients for its own centres and for ``features`` (summed over processes, they
    are the gradient of ``features``). Without a process group it is the one-process loss.

    Shape:
        features: (N, D), the scaled unit embeddings of the whole batch; weight: (S, D) this
        process's centres; column: (N,) the row of ``weight`` that is sample i's class, -1
        where another process holds it; returns a scalar.
    """
    workspace = workspace if workspace is not None else Workspace()
    return _ShardedMarginCE.apply(
        features, weight, column, float(radius), target_logit, bool(target_in_denominator), workspace
    )


def _is_whole(value, num_classes: int) -> bool:
    return torch.is_tensor(value) and value.dim() > 0 and value.shape[0] == num_classes


def _shared_seed() -> int:
    """A seed drawn from rank 0's global RNG, the same on every process."""
    seed = torch.randint(0, 2**62, (1,))
    if distributed.is_distributed():
        dist.broadcast(seed, src=0)
    return int(seed)


class PartialFC:
    """This process's block of a head's C class centres, the centres it samples each step, and
    the conversions between the block and the whole head in class order.

    Built when the head is (after the process group starts, so that it knows its rank): a head
    of C classes on W processes holds rows :func:`shard_bounds` of them.

    Args:
        num_classes: C, at least the number of processes.
        sample_rate: the share of its block a process keeps each step, positives included.
    """

    def __init__(self, num_classes: int, sample_rate: float) -> None:
        self.rank, self.world = distributed.rank(), distributed.world_size()
        if num_classes < self.world:
            raise ValueError(
                f"num_classes must be at least the number of processes ({self.world}) with partial_fc=True, "
                f"got {num_classes}"
            )
        self.num_classes, self.sample_rate = num_classes, sample_rate
        self.start, self.stop = shard_bounds(num_classes, self.rank, self.world)
        self.seed = _shared_seed()
        self.steps = 0  # loss calls so far: each samples with its own seed

    @property
    def rows(self) -> int:
        return self.stop - self.start

    def init_rows(self, block: torch.Tensor, fill: Callable[[torch.Tensor, torch.Generator], None]) -> None:
        """Fill this process's (rows, D) ``block`` as rows ``[start, stop)`` of a (C, D) matrix whose
        every ``_INIT_BLOCK`` rows ``fill(rows, generator)`` draws from a generator of its own."""
        first, last = self.start // _INIT_BLOCK, (self.stop - 1) // _INIT_BLOCK
        with torch.no_grad():
            for number in range(first, last + 1):
                low = number * _INIT_BLOCK
                rows = torch.empty(min(_INIT_BLOCK, self.num_classes - low), block.shape[1], dtype=block.dtype)
                fill(rows, torch.Generator().manual_seed(self.seed + number))
                begin, end = max(low, self.start), min(low + len(rows), self.stop)
                block[begin - self.start : end - self.start].copy_(rows[begin - low : end - low])

    def sampling_state(self) -> torch.Tensor:
        """``[seed, steps]`` (int64): with them a resumed run samples the centres the run never
        stopped would have sampled. The same on every process."""
        return torch.tensor([self.seed, self.steps], dtype=torch.int64)

    def load_sampling_state(self, state: torch.Tensor) -> None:
        """Continue from :meth:`sampling_state`'s ``[seed, steps]``."""
        self.seed, self.steps = (int(value) for value in state.tolist())

    def sample(self, labels: torch.Tensor, step: int) -> torch.Tensor:
        """The rows of the block kept at ``step`` for the global batch's ``labels``
        (:func:`sample_centres`, seeded by the head's seed, the step and the rank)."""
        generator = torch.Generator(device=labels.device).manual_seed(hash((self.seed, step, self.rank)) % 2**63)
        return sample_centres(labels, self.start, self.stop, self.sample_rate, generator)

    def loss(
        self,
        embeddings: torch.Tensor,
        labels: torch.Tensor,
        block: torch.Tensor,
        scale: float,
        target_logit: Callable[[torch.Tensor], torch.Tensor],
        target_in_denominator: bool = True,
        workspace: Workspace | None = None,
    ) -> torch.Tensor:
        """The loss of every process's embeddings against the sampled centres of every block.

        ``features = scale * x / ||x||`` of the gathered embeddings meet the centres; the
        target's radius is ``scale``. Advances the sampling step.

        Shape:
            embeddings: (n, D) this process's; labels: (n,) int64 in [0, C); block: (rows, D).
        """
        world = self.world
        if world > 1:  # the same batch size everywhere (checked), then the gathers
            embeddings = distributed.gather_with_grad(_ScaleGradient.apply(embeddings, float(world)))
            labels = distributed.gather_no_grad(labels, check=False)
        index = self.sample(labels, self.steps)
        self.steps += 1
        with full_precision(embeddings.device):
            dtype = torch.promote_types(upcast(embeddings).dtype, upcast(block).dtype)
            features = _scaled_unit_rows(embeddings.to(dtype), scale)  # (N, D)
            # At rate 1 the block itself: no (rows, D) copy and no scatter of its gradient.
            centres = block.to(dtype) if len(index) == self.rows else block.to(dtype)[index]  # (S, D)
            here = (labels >= self.start) & (labels < self.stop)
            column = torch.full_like(labels, -1)
            column[here] = torch.searchsorted(index, labels[here] - self.start)
            return sharded_margin_cross_entropy(
                features, centres, column, scale, target_logit, target_in_denominator, workspace
            )

    def gather_rows(self, block: torch.Tensor) -> torch.Tensor:
        """The (C, ...) whole from every process's (rows, ...) ``block``, in class order (a
        collective: every process calls it). Detached."""
        block = block.detach()
        if self.world == 1:
            return block
        longest = shard_bounds(self.num_classes, 0, self.world)
        padded = block.new_zeros((longest[1] - longest[0], *block.shape[1:]))
        padded[: len(block)] = block
        parts = [torch.empty_like(padded) for _ in range(self.world)]
        dist.all_gather(parts, padded)
        bounds = [shard_bounds(self.num_classes, r, self.world) for r in range(self.world)]
        sizes = [stop - start for start, stop in bounds]
        return torch.cat([part[:size] for part, size in zip(parts, sizes)])

    def own_rows(self, whole: torch.Tensor) -> torch.Tensor:
        """This process's rows of a (C, ...) tensor in class order."""
        return whole[self.start : self.stop]

    def keep_optimizer_state_in_class_order(self, optimizer: torch.optim.Optimizer, block: torch.Tensor) -> None:
        """Make ``optimizer.state_dict()`` hold ``block``'s per-row state (momentum, Adam's moments)
        for the whole head in class order, and ``load_state_dict`` take this process's rows of it.

        Every process must then call ``state_dict()`` (``accelerator.save_state`` does). Registers
        a state-dict post-hook and a load pre-hook on ``optimizer``.
        """

        def position() -> int:  # the block's number in a state_dict: parameters count in group order
            params = [p for group in optimizer.param_groups for p in group["params"]]
            return next(i for i, p in enumerate(params) if p is block)

        def gathered(opt, state_dict):
            # New dicts: state_dict() hands out the optimizer's own per-parameter dicts.
            states, number = dict(state_dict["state"]), position()
            if number in states:
                states[number] = {
                    key: self.gather_rows(value) if torch.is_tensor(value) and value.shape == block.shape else value
                    for key, value in states[number].items()
                }
            return {**state_dict, "state": states}

        def own(opt, state_dict):
            states, number = dict(state_dict["state"]), position()
            if number in states:
                states[number] = {
                    key: self.own_rows(value) if _is_whole(value, self.num_classes) else value
                    for key, value in states[number].items()
                }
            return {**state_dict, "state": states}

        optimizer.register_state_dict_post_hook(gathered)
        optimizer.register_load_state_dict_pre_hook(own)


def keep_optimizer_state_in_class_order(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """For every Partial FC head in ``model``, :meth:`PartialFC.keep_optimizer_state_in_class_order`
    on ``optimizer``: its checkpoints then hold each head's optimizer state whole, in class order,
    and resume on any number of processes. Call it once, after the optimizer is built and before
    a checkpoint is loaded. Returns the names of the parameters it covers (``[]``: none)."""
    names = []
    for prefix, module in model.named_modules():
        for name in getattr(module, "sharded_parameters", ()):
            module.partial_fc.keep_optimizer_state_in_class_order(optimizer, getattr(module, name))
            names.append(f"{prefix}.{name}" if prefix else name)
    return names
