"""BatchNorm whose statistics cover the whole global batch, on every process: SyncBatchNorm, CPU included.

Why. With data parallel training each process normally normalises its own slice of the batch.
SimCLR [0] (section 2.2, "Global BN") found that this lets a contrastive model cheat: the two
views of an image sit on the same device, and the local statistics leak which samples were
batched together, so the model can lower the loss without better representations; it
aggregates the mean and variance over all devices instead. MoCo v3 [1] and solo-learn
(``sync_batchnorm: True``) do the same. ``model.sync_batchnorm: true`` converts every BatchNorm
of the model with :func:`convert_sync_batchnorm`.

Why not only ``torch.nn.SyncBatchNorm``: its kernels run on CUDA, XPU and HPU, it raises for
CPU tensors, and DDP refuses a CPU model holding one, so a multi-process CPU run
(``accelerate launch --cpu --num_processes 2``) could not use it, nor could it be tested here.
:func:`convert_sync_batchnorm` uses torch's class wherever its kernels run, and elsewhere
:class:`GlobalBatchNorm`, which combines the statistics itself: one small all-gather per layer
(:func:`_global_moments`). Both keep BatchNorm's state-dict keys: checkpoints load either way.

References:
    [0] SimCLR, Chen et al. 2020, https://arxiv.org/abs/2002.05709
    [1] MoCo v3, Chen, Xie, He 2021, https://arxiv.org/abs/2104.02057
    [2] Chan, Golub, LeVeque 1979: combining per-part means and sums of squared deviations
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from sslkit import distributed


def _privateuse1_backend_name() -> str:
    """The device type of an out-of-tree (PrivateUse1) backend, as torch.nn.SyncBatchNorm checks it.

    torch's getter is private, hence guarded; without it, the name torch gives that backend until
    a plugin renames it.
    """
    getter = getattr(torch._C, "_get_privateuse1_backend_name", None)
    return getter() if getter is not None else "privateuseone"


# Devices on which torch.nn.SyncBatchNorm has kernels (see its forward).
_TORCH_SYNC_DEVICES = ("cuda", "xpu", "hpu", _privateuse1_backend_name())


def _global_moments(
    mean: torch.Tensor, variance: torch.Tensor, count: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Combine every process's per-channel mean and biased variance into the global ones (no gradient).

    Each process sends its count ``n_r``, mean ``mu_r`` and sum of squared deviations
    ``M_r = n_r var_r``; then, with ``n = sum_r n_r`` ([2], the stable pairwise form, not
    ``E[x^2] - E[x]^2``, which loses the digits of a channel whose mean is far from 0)::

        mu  = sum_r n_r mu_r / n
        var = (sum_r M_r + n_r (mu_r - mu)^2) / n

    Shape:
        mean, variance: (C,) of this process; returns the global (C,), (C,) and the 0-d count n.
    """
    counts = torch.full_like(mean, count)
    # (W, 3, C): one collective, one row each
    parts = distributed.gather_no_grad(torch.stack([mean, variance * counts, counts]).unsqueeze(0), check=False)
    means, sums, counts = parts[:, 0], parts[:, 1], parts[:, 2]
    total = counts.sum(0)  # (C,), every entry n
    global_mean = (counts * means).sum(0) / total
    global_variance = (sums + counts * (means - global_mean).square()).sum(0) / total
    return global_mean, global_variance, total[0]


class _GlobalBatchNormFunction(torch.autograd.Function):
    """``y = (x - mu) / sqrt(var + eps) * w + b`` with ``mu, var`` of the global batch; exact backward.

    Forward: torch's fused BatchNorm kernel on the local batch, the global moments (one
    all-gather of 3C numbers), then one affine map per channel. Backward, with ``xhat = (x - mu) / sigma``
    and the sums over the global batch of ``n`` samples (one all-reduce of 2C numbers)::

        dL/dx = w / sigma * (dy - sum(dy) / n - xhat * sum(dy * xhat) / n)
        dL/dw = sum_local(dy * xhat),   dL/db = sum_local(dy)

    The input gradient includes what this process's samples did to every process's output
    through the shared moments (the sums are global), as torch's SyncBatchNorm computes it;
    the weight and bias gradients are local sums, which DDP then averages.

    Hand-written so that torch's fused kernels do the passes over the activations, close to
    plain BatchNorm's own cost; autograd through ``torch.var_mean`` makes more passes and graph
    nodes. Across processes a step is still slower than with per-process BatchNorm: each layer
    adds two collectives, at each of which a process waits for the others.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum, eps, num_batches_tracked):
        # torch's fused training kernel for the local moments (much faster on the CPU than
        # torch.var_mean over (N, H, W)); its output, normalised with them, is then moved to the global
        # ones by one affine map per channel: y = y_local * sigma_r / sigma * w + (mu_r - mu) / sigma * w + b.
        out, local_mean, local_inv_std = torch.native_batch_norm(x, None, None, None, None, True, 0.0, eps)
        local_variance = (local_inv_std.pow(-2) - eps).clamp_min(0)  # (C,)
        mean, variance, count = _global_moments(local_mean, local_variance, x.numel() // x.shape[1])
        if running_mean is not None:
            num_batches_tracked.add_(1)
            factor = momentum if momentum is not None else 1.0 / float(num_batches_tracked)
            running_mean.lerp_(mean.to(running_mean.dtype), factor)
            unbiased = variance * (count / (count - 1).clamp_min(1))
            running_var.lerp_(unbiased.to(running_var.dtype), factor)
        inv_std = torch.rsqrt(variance + eps)
        gain = inv_std * weight if weight is not None else inv_std  # (C,) w / sigma
        shift = (local_mean - mean) * gain + (bias if bias is not None else 0)
        shape = (1, -1, *([1] * (x.dim() - 2)))
        ctx.save_for_backward(x, weight, mean, variance)
        ctx.eps, ctx.count = eps, count
        return out.mul_((gain / local_inv_std).view(shape)).add_(shift.view(shape))

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, mean, variance = ctx.saved_tensors
        affine = weight is not None
        # One fused pass: w / sigma * dy, and the local sums of dy * xhat and dy.
        partial, sum_dy_xhat, sum_dy = torch.ops.aten.native_batch_norm_backward(
            grad_out.contiguous(memory_format=_memory_format(x)),
            x,
            weight,
            mean,
            variance,
            None,
            None,
            False,
            ctx.eps,
            [True, True, True],
        )
        grad_weight, grad_bias = (sum_dy_xhat, sum_dy) if affine else (None, None)  # local sums: DDP averages them
        sums = torch.stack([sum_dy, sum_dy_xhat])  # (2, C), a copy: the all-reduce leaves the local sums alone
        if distributed.is_distributed():
            torch.distributed.all_reduce(sums)
        mean_dy, mean_dy_xhat = sums / ctx.count  # (C,) each
        inv_std = torch.rsqrt(variance + ctx.eps)
        gain = inv_std * weight if affine else inv_std  # w / sigma
        # dL/dx = partial - w/sigma * mean_dy - (x - mu) * w/sigma^2 * mean_dy_xhat, as x * a + c per channel
        shape = (1, -1, *([1] * (x.dim() - 2)))
        a = -(gain * inv_std * mean_dy_xhat)
        c = -(gain * mean_dy) - mean * a
        grad_x = partial.addcmul_(x, a.view(shape)).add_(c.view(shape))
        return grad_x, grad_weight, grad_bias, None, None, None, None, None


def _memory_format(x: torch.Tensor) -> torch.memory_format:
    return (
        torch.channels_last
        if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
        else torch.contiguous_format
    )


class GlobalBatchNorm(_BatchNorm):
    """BatchNorm with the statistics of the global batch of all processes, on any device (SimCLR's global BN).

    In training, with more than one process, every process normalises with the mean and
    variance of the global batch::

        y = (x - mu) / sqrt(var + eps) * weight + bias,   mu, var over (N, H, W) of every process

    and updates the running statistics with them (``running_var`` with the unbiased ``var``, as
    BatchNorm does), so all processes keep equal running statistics. In one process, or in
    eval mode, it is plain BatchNorm. Statistics are computed in fp32 (fp64 stays fp64); the
    output has the input's dtype. Same parameters, buffers and state-dict keys as BatchNorm.

    Not a subclass of ``torch.nn.SyncBatchNorm``: DDP refuses any module holding one of those
    when the model is on the CPU.

    Shape:
        input: (N, C) or (N, C, L) in place of a BatchNorm1d, (N, C, H, W) of a BatchNorm2d,
        (N, C, D, H, W) of a BatchNorm3d; returns the same shape.

    >>> layer = GlobalBatchNorm(8)
    >>> layer(torch.randn(4, 8, 5, 5)).shape
    torch.Size([4, 8, 5, 5])
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"GlobalBatchNorm expects (N, C, ...) input, got shape {tuple(input.shape)}")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not (self.training and distributed.is_distributed()):
            return super().forward(input)  # plain BatchNorm: one process, or eval mode
        self._check_input_dim(input)
        x = input if input.dtype == torch.float64 else input.float()
        weight = self.weight.to(x.dtype) if self.affine else None
        bias = self.bias.to(x.dtype) if self.affine else None
        running = self.track_running_stats and self.running_mean is not None
        out = _GlobalBatchNormFunction.apply(
            x,
            weight,
            bias,
            self.running_mean if running else None,
            self.running_var if running else None,
            self.momentum,
            self.eps,
            self.num_batches_tracked if running else None,
        )
        return out.to(input.dtype)


def convert_sync_batchnorm(module: nn.Module, device_type: str) -> nn.Module:
    """Make every BatchNorm inside ``module`` normalise over the global batch; returns the module.

    On CUDA, XPU and HPU: ``torch.nn.SyncBatchNorm.convert_sync_batchnorm`` (torch's fused
    kernels). Elsewhere (the CPU): every ``nn.BatchNorm1d/2d/3d`` becomes a :class:`GlobalBatchNorm`
    holding the same parameter and buffer objects. Only those exact classes: a BatchNorm
    subclass with its own forward (MoCo's :class:`~sslkit.methods.moco.SplitBatchNorm`) would
    lose it; MoCo refuses that combination in its ``from_config``.
    """
    if device_type in _TORCH_SYNC_DEVICES:
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    if type(module) in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d):
        converted = GlobalBatchNorm(
            module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats
        )
        # The same parameter and buffer objects: device, dtype, requires_grad and values carry over.
        if module.affine:
            converted.weight, converted.bias = module.weight, module.bias
        if module.track_running_stats:
            converted.running_mean, converted.running_var = module.running_mean, module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
        converted.train(module.training)
        return converted
    for name, child in module.named_children():
        module.add_module(name, convert_sync_batchnorm(child, device_type))
    return module
