"""The margin-softmax family: normalise, cosine, change the target logit, scale, cross-entropy.

NormFace, CoCo, L-Softmax, SphereFace, CosFace, ArcFace and AdaCos differ only in how the
logit of the true class is changed and in how the cosines are scaled, so they share one
forward pass here (as pytorch-metric-learning's ``LargeMarginSoftmaxLoss`` is the base of its
``ArcFaceLoss``). A head overrides at most these hooks:

* ``target_logit(cos_target)``: the margin, applied to the (N,) target cosines only;
* ``scale``: the length the normalised features are scaled to (``s``; ``1/T`` for NormFace);
* ``normalize_features`` / ``normalize_weights``: ``False`` keeps ``||x||`` / ``||W_j||`` in the
  logits (SphereFace keeps ``||x||``; L-Softmax keeps both).

AdaCos's dynamic scale additionally overrides ``forward`` to update ``s`` between the cosine and
the loss.

Why hand-written autograd functions. The (N, C) logit matrix is the only large tensor, and at
face-recognition sizes (N=512, D=512, C=10,000) every extra pass over an (N, C) or (C, D)
tensor costs a few percent of the three (N x D x C) matmuls. The plain-autograd way
(a one-hot (N, C) mask as in pytorch-metric-learning, then ``F.cross_entropy``) allocates
half a dozen (N, C) temporaries; ``F.normalize`` on the (C, D) weights adds as many again.

* :func:`cosine_margin_cross_entropy` (every head whose class weights are normalised) does the
  whole loss in one function: the forward is the matmul, one column scaling fused with the
  shift that the backward's own column scaling needs (``addcmul``), one ``exp`` and a row
  sum (a matrix-vector product) in the matmul's own buffer; the backward folds every per-row
  factor into the thin (N, D) side of its two matmuls, and writes the target column's
  gradient into the softmax matrix so that the same two matmuls carry it. Its two large
  temporaries (the (N, C) logits and the (C, D) product before the weight gradient's radial
  part is removed) are reused from the head's :class:`~sslkit.losses._workspace.Workspace`,
  so that a step does not fault fresh pages in for them. What is left over the three matmuls
  is memory passes (``tools/bench/losses.py --only heads`` times them against the bare matmuls
  and pytorch-metric-learning): the weight norms, one ``addcmul``, one ``exp``, one row sum and
  the radial part of the weight gradient (:func:`_unit_weight_grad`), each over an array too
  large to still be in cache after the matmul, and a few small per-row ops. Its one host sync
  (the largest target logit and the range of the weight norms, to decide whether the softmax
  needs a row shift, and the smallest weight norm, for the backward) adds nothing to a
  training step, which syncs on the loss anyway. (Normalising the features is one more:
  whether a row is too short for the fused kernel.)
* :func:`margin_cross_entropy` and :func:`cosine_logits` are the two steps separately, for the
  heads that must see the logits before the loss (AdaCos's dynamic scale) or keep ``||W_j||``
  (L-Softmax): the target column of the matmul's output is edited in place, turned into
  log-probabilities in place, and in backward into the gradient in place; the product's
  columns are scaled by ``1/||W_j||`` instead of normalising the (C, D) weight.

References:
    [0] Large-Margin Softmax (L-Softmax), Liu et al. 2016, https://arxiv.org/abs/1612.02295
    [1] NormFace, Wang et al. 2017, https://arxiv.org/abs/1704.06369
    [2] ArcFace, Deng et al. 2019, https://arxiv.org/abs/1801.07698 (compares SphereFace, CosFace, ArcFace)
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from sslkit.losses._common import check_flag, full_precision, needs_row_shift, upcast
from sslkit.losses._workspace import Workspace
from sslkit.losses.head import Head

_NORM_EPS = 1e-12

# aten's fused weight-norm kernels (private ops, so guarded): one pass over memory where the same
# maths in public ops takes several. Chosen once here; the tests also run the public fallback.
FUSED_WEIGHT_NORM = hasattr(torch, "_weight_norm_interface") and hasattr(
    torch.ops.aten, "_weight_norm_interface_backward"
)


def _unit_weight_grad(
    grad: torch.Tensor, weight: torch.Tensor, norm: torch.Tensor, degenerate: bool | None = None
) -> torch.Tensor:
    """The gradient of the raw (C, D) class weights, its radial part removed, in one fused pass.

    With ``grad`` the gradient with respect to ``W / ||W||`` already divided by ``||W_j||``
    (row j), this is the chain rule through the normalisation::

        d W_j = grad_j - W_j <grad_j, W_j> / ||W_j||^2

    Where ``||W_j||`` is below eps (clamped, as in ``F.normalize``) the row has no radial part.
    This is weight normalisation's backward (Salimans & Kingma 2016, eq. 4) with the gain g set
    to ``||W_j||``, so aten's fused kernel for it does the work (:data:`FUSED_WEIGHT_NORM`): one
    pass over memory, where the public ops of the fallback make three.

    ``degenerate``: whether some row's norm is <= eps, when the caller already knows (a host
    sync fewer on an accelerator); None checks here.

    Shape:
        grad, weight: (C, D); norm: (C,) the rows' L2 norms, unclamped. Returns (C, D).
    """
    clamped = norm.clamp_min(_NORM_EPS).unsqueeze(1)  # (C, 1)
    if FUSED_WEIGHT_NORM:  # the kernel reads storage whatever the strides: contiguous copies first
        grad_weight, _ = torch.ops.aten._weight_norm_interface_backward(
            grad.contiguous(), weight.contiguous(), clamped, clamped, 0
        )
    else:
        radial = torch.linalg.vecdot(grad, weight, dim=1).unsqueeze(1) / (clamped * clamped)  # (C, 1)
        grad_weight = grad - weight * radial
    if degenerate is None:
        degenerate = bool((norm <= _NORM_EPS).any())
    if degenerate:  # all-zero rows: rare, so one small check beats a where() pass
        grad_weight = torch.where((norm <= _NORM_EPS).unsqueeze(1), grad, grad_weight)
    return grad_weight


def _scaled_unit_rows(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``scale * x_i / max(||x_i||, eps)``, differentiable, in two fused kernels.

    This is weight normalisation (Salimans & Kingma 2016, eq. 2) of the rows with the gain g
    set to ``scale``: aten's fused forward and backward for it (:data:`FUSED_WEIGHT_NORM`)
    replace the norm, clamp, reciprocal and products through autograd, several passes and graph
    nodes. It divides by ``||x_i||`` unclamped, so a batch with a (near-)zero row takes the
    clamped way instead, as ``F.normalize`` does; so does everything without the fused kernel.

    Shape:
        x: (N, D); returns (N, D).
    """
    if x.shape[0] == 0:  # aten's CPU kernel dies with SIGFPE (a division by zero) on no rows
        return x * scale
    if FUSED_WEIGHT_NORM:
        # aten's CPU kernel reads the first N*D numbers of storage whatever the strides (a CLS-token
        # slice x[:, 0] came out wrong) and its backward refuses a non-contiguous input: copy first.
        x = x.contiguous()
        gain = torch.full((x.shape[0], 1), scale, dtype=x.dtype, device=x.device)
        unit, norm = torch._weight_norm_interface(x, gain, 0)
        if bool((norm > _NORM_EPS).all()):
            return unit
    return x * (torch.linalg.vector_norm(x, dim=1, keepdim=True).clamp_min(_NORM_EPS).reciprocal() * scale)


def _product_in_workspace(
    features: torch.Tensor, weight: torch.Tensor, workspace: Workspace
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``F W^T`` in the workspace's (N, C) "logits" buffer, and the class weights' norms.

    The fused losses' forward starts here (the caller gives the buffer back when its last
    reader is done). Returns ``(F W^T, norm, inv_norm)``: (N, C), (C,) unclamped, (C,) the
    reciprocal of the norm clamped to eps (as ``F.normalize`` divides).
    """
    norm = torch.linalg.vector_norm(weight, dim=1)  # (C,)
    inv_norm = norm.clamp_min(_NORM_EPS).reciprocal_()
    product = workspace.take("logits", (features.shape[0], weight.shape[0]), features.dtype, features.device)
    torch.mm(features, weight.T, out=product)
    return product, norm, inv_norm


def _cosines_in_workspace(
    features: torch.Tensor, weight: torch.Tensor, workspace: Workspace
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``L = F W^T diag(1 / ||W_j||)`` in the workspace's buffer: :func:`_product_in_workspace`
    with its columns scaled. Returns ``(L, norm, inv_norm)``."""
    product, norm, inv_norm = _product_in_workspace(features, weight, workspace)
    return product.mul_(inv_norm), norm, inv_norm


def _weight_grad_via_workspace(
    grad_logits: torch.Tensor,
    rows: torch.Tensor,
    weight: torch.Tensor,
    norm: torch.Tensor,
    workspace: Workspace,
    degenerate: bool | None = None,
) -> torch.Tensor:
    """``d W`` from the gradient with respect to ``F W^T`` (already column-scaled by ``1/||W_j||``).

    ``K = grad_logits^T rows`` goes into the workspace's reused (C, D) buffer, then
    :func:`_unit_weight_grad` removes its radial part into the tensor returned.
    """
    product = workspace.take("weight_grad", tuple(weight.shape), weight.dtype, weight.device)
    torch.mm(grad_logits.T, rows, out=product)
    grad_weight = _unit_weight_grad(product, weight, norm, degenerate)  # (C, D)
    workspace.give_back("weight_grad", product)
    return grad_weight


class _CosineLogits(torch.autograd.Function):
    """``features @ (weight / ||weight||)^T`` without materialising the normalised weight.

    forward: ``L = features @ weight^T``, then column j scaled in place by ``inv_j = 1/||W_j||``.
    backward, with ``G = grad * inv`` (N, C) and ``K = G^T features`` (C, D)::

        d features = G @ weight
        d W_j      = K_j - W_j inv_j^2 <K_j, W_j>      (the radial part of the gradient removed)

    Same values and gradients as ``features @ F.normalize(weight).T``, with one in-place (N, C)
    pass instead of a normalised (C, D) copy and the (C, D) temporaries of its autograd backward.
    With a private gradient and a workspace, ``L`` is the workspace's "logits" buffer, given
    back when the backward is done with the gradient that was written into it.
    """

    @staticmethod
    def forward(ctx, features, weight, private_grad, workspace):
        norm = torch.linalg.vector_norm(weight, dim=1)  # (C,)
        inv_norm = norm.clamp_min(_NORM_EPS).reciprocal_()
        shape = (features.shape[0], weight.shape[0])
        use_workspace = private_grad and workspace is not None
        logits = workspace.take("logits", shape, features.dtype, features.device) if use_workspace else None
        logits = torch.mm(features, weight.T, out=logits) if logits is not None else features @ weight.T
        logits.mul_(inv_norm)  # (N, C)
        ctx.save_for_backward(features, weight, norm, inv_norm)
        ctx.private_grad = private_grad
        # The buffer goes back only if the gradient arrives in it (margin_cross_entropy's does).
        ctx.workspace, ctx.buffer_address = (workspace, logits.data_ptr()) if use_workspace else (None, None)
        return logits

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
        features, weight, norm, inv_norm = ctx.saved_tensors
        # (N, C). In place only when the caller vouches that nobody else reads this gradient.
        grad = grad.mul_(inv_norm) if ctx.private_grad else grad * inv_norm
        grad_features = grad @ weight if ctx.needs_input_grad[0] else None
        grad_weight = None
        workspace = ctx.workspace if ctx.workspace is not None else Workspace()
        if ctx.needs_input_grad[1]:
            grad_weight = _weight_grad_via_workspace(grad, features, weight, norm, workspace)  # (C, D)
        if ctx.workspace is not None and grad.data_ptr() == ctx.buffer_address:
            ctx.workspace.give_back("logits", grad)
        return grad_features, grad_weight, None, None


def cosine_logits(
    features: torch.Tensor, weight: torch.Tensor, private_grad: bool = False, workspace: Workspace | None = None
) -> torch.Tensor:
    """``features @ F.normalize(weight, dim=1).T``, cheaper in memory traffic; see :class:`_CosineLogits`.

    ``private_grad=True`` lets backward scale the incoming (N, C) gradient in place, saving an
    (N, C) allocation. Only pass it when the result goes straight into
    :func:`margin_cross_entropy` (whose gradient buffer is its own); a ``workspace`` then also
    lends the (N, C) and (C, D) buffers, reused across calls on the CPU.

    Shape:
        features: (N, D) (already scaled as the caller wants); weight: (C, D); returns (N, C).
    """
    return _CosineLogits.apply(features, weight, check_flag(private_grad, "private_grad"), workspace)


class _TargetGraph:
    """The target logit as a small autograd graph on (N,) leaves, kept from forward to backward.

    ``target_i = r_i * target_logit(raw_i / r_i)``: ``raw`` are the target column's logits and
    ``r`` one radius per row, even when the caller gave one number (so a caller can scale each
    row's radius gradient before they are summed back). Both autograd functions below build it
    in forward and differentiate it in backward with :meth:`grads`.
    """

    def __init__(self, raw: torch.Tensor, radius: torch.Tensor, target_logit) -> None:
        self.radius_shape = radius.shape
        with torch.enable_grad():
            self.raw = raw.detach().requires_grad_()
            self.r = radius.detach().expand(raw.shape).clone().requires_grad_(radius.requires_grad)
            # A zero-length embedding has raw = 0 and r = 0; its cosine is 0, not 0/0.
            self.target = self.r * target_logit(self.raw / self.r.clamp_min(_NORM_EPS))  # (N,)

    def grads(self, upstream: torch.Tensor, radius_factor: torch.Tensor | float = 1.0):
        """``(d/d raw, d/d radius)`` of ``sum(upstream * target)``; the radius part per row times
        ``radius_factor``, summed back to the radius's shape (None when it needs no gradient)."""
        inputs = (self.raw, self.r) if self.r.requires_grad else (self.raw,)
        grads = torch.autograd.grad(self.target, inputs, upstream.to(self.target.dtype), allow_unused=True)
        grad_raw = grads[0] if grads[0] is not None else torch.zeros_like(self.raw)
        grad_radius = None
        if len(grads) > 1 and grads[1] is not None:
            grad_radius = (grads[1] * radius_factor).sum_to_size(self.radius_shape)
        return grad_raw, grad_radius


class _MarginCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``logits`` with the target column replaced, computed in place.

    forward: ``logits <- k logits`` (``k = logit_scale``, skipped when 1), then
    ``logits[i, y_i] <- r_i * target_logit(logits[i, y_i] / r_i)``, then
    ``logits <- log_softmax(logits)`` in the same memory; loss ``= -mean_i logits[i, y_i]``.
    backward: the stored log-probabilities become ``k (softmax - onehot) / N`` in place; the
    target column gets the chain rule through ``target_logit`` (autograd on (N,) tensors).
    """

    @staticmethod
    def forward(ctx, logits, labels, radius, target_logit, logit_scale):
        if logit_scale != 1.0:
            logits.mul_(logit_scale)
        ctx.logit_scale = logit_scale
        column = labels.unsqueeze(1)  # (N, 1)
        graph = _TargetGraph(logits.gather(1, column).squeeze(1), radius, target_logit)
        logits.scatter_(1, column, graph.target.detach().unsqueeze(1).to(logits.dtype))
        # In place: the matmul's output becomes the log-probabilities; no (N, C) copy.
        log_probs = torch.log_softmax(logits, dim=1, out=logits)
        ctx.mark_dirty(logits)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(log_probs, labels)
        ctx.graph = graph
        loss = -log_probs.gather(1, column).mean()
        return loss, log_probs

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss, _grad_log_probs):
        if getattr(ctx, "graph", None) is None:
            raise RuntimeError(
                "margin_cross_entropy reuses its saved buffer for the gradient: it supports one "
                "backward pass (retain_graph=True with a second backward is not supported)"
            )
        log_probs, labels = ctx.saved_tensors
        graph, ctx.graph = ctx.graph, None
        if grad_loss is None:
            return None, None, None, None, None
        n = log_probs.shape[0]
        column = labels.unsqueeze(1)
        weight, k = grad_loss / n, ctx.logit_scale
        probs = log_probs.exp_()  # (N, C) softmax, in place
        grad_target = probs.gather(1, column).squeeze(1) * weight - weight  # (N,) d loss / d target logit
        grad_raw, grad_radius = graph.grads(grad_target)
        grad = probs.mul_(weight * k)  # (N, C) k softmax dL/dloss / N: the gradient of the unscaled logits
        grad.scatter_(1, column, (grad_raw * k).unsqueeze(1).to(grad.dtype))
        return grad, None, grad_radius, None, None


def margin_cross_entropy(logits, labels, target_logit, radius, logit_scale: float = 1.0) -> torch.Tensor:
    """Mean cross-entropy after changing only the target logit: the margin-softmax core.

    With ``r_i = radius[i]`` (or one number for every row) and ``k = logit_scale``::

        logit_ij = k logits_ij                                 for j != y_i
        logit_iy = r_i * target_logit(k logits_iy / r_i)       (cos_iy = k logits_iy / r_i)
        loss = mean_i -log softmax(logit_i)[y_i]

    ``k`` (a constant, no gradient) rescales logits computed at another scale, as AdaCos's
    dynamic scale does, inside the function: the gradient then stays in the same buffer.

    **``logits`` is overwritten** (it becomes the log-probabilities, then the gradient): pass a
    tensor nothing else uses, such as the output of the cosine matmul. Gradients flow to
    ``logits`` and to ``radius``; one backward pass only.

    Shape:
        logits: (N, C), floating; overwritten.
        labels: (N,) integer class ids in [0, C).
        target_logit: callable (N,) -> (N,) on cosines.
        radius: float, 0-d tensor, or (N,) tensor.
        returns: scalar.
    """
    radius = torch.as_tensor(radius, dtype=logits.dtype, device=logits.device)
    loss, _ = _MarginCrossEntropy.apply(logits, labels, radius, target_logit, float(logit_scale))
    return loss


class _CosineMarginCE(torch.autograd.Function):
    """The margin-softmax loss on raw class weights, fused: see :func:`cosine_margin_cross_entropy`.

    forward, with ``inv_j = 1 / ||W_j||`` and the (already scaled) features ``F``::

        L = F W^T diag(inv)  (N, C);  t_i = r_i target_logit(L_iy / r_i);  L_iy <- -inf
        E = exp(L - m)  (target column 0; m = 0 while |L| is small enough, else the row max)
        Z_i = sum_j E_ij + exp(t_i - m_i);   loss = mean_i (log Z_i + m_i - t_i)
        (without the target's ``exp(t_i - m_i)`` in Z_i when ``target_in_denominator`` is False)

    While the exponents stay in fp range (``|L| + max_j |log ||W_j||| `` under the bound of
    :func:`~sslkit.losses._common.needs_row_shift`, as at any trained or initialised scale)
    the forward stores ``E diag(inv) = exp(F W^T diag(inv) - log ||W_j||)`` instead, one
    ``addcmul`` and one ``exp`` over the matmul's buffer, and sums ``Z_i = (E diag(inv)) ||W||``
    with a matrix-vector product: the backward's column scaling then costs no pass of its own.

    backward, with ``a_i = g / (N Z_i)``, ``b_i`` = d loss / d L_iy (through ``t_i``),
    ``U_j = inv_j W_j`` and ``E'`` = E with its target entries set to ``b_i / a_i``, then
    scaled by column (``E' diag(inv)``)::

        dL/dF   = a * (E' W)
        dL/dW_j = K_j - W_j inv_j^2 <K_j, W_j>,   K = E'^T (a * F)

    (the second line is the chain rule through ``U = W / ||W||``: ``inv_j`` times the
    gradient with respect to ``U_j`` less its radial part). ``b_i / a_i`` is computed without
    ``g``: the target logit's chain rule runs with the upstream gradient ``exp(t_i - m_i) - Z_i``.
    Every per-row factor lands on the thin (N, D) side, the per-class ``inv`` rides in the
    forward's ``exp``, and the target column rides in the same two matmuls: after the forward's
    ``exp`` and row sum no other pass over the (N, C) matrix is left but the backward matmuls,
    no sparse (N, D) or (C, D) update, and no (C, D) normalised weight is made.
    The plain way (``log_softmax`` of the edited logits, autograd's ``(softmax - onehot)`` and
    the normalised weight's backward) makes six or more (N, C) passes and two (C, D) copies.
    """

    @staticmethod
    def forward(ctx, features, weight, labels, radius, target_logit, max_abs_logit, workspace, target_in_denominator):
        # (N, C) F W^T: the cosines times the scale, times ||W_j||
        logits, norm, inv_norm = _product_in_workspace(features, weight, workspace)
        clamped = norm.clamp_min(_NORM_EPS)  # as F.normalize divides
        column = labels.unsqueeze(1)
        graph = _TargetGraph(logits.gather(1, column).squeeze(1) * inv_norm[labels], radius, target_logit)
        t = graph.target.detach().to(logits.dtype)
        logits.scatter_(1, column, float("-inf"))  # the target's exp is added from t below
        log_norm = clamped.log()  # (C,)
        # One host sync for the facts the loss needs: the largest target logit and the range of
        # log ||W_j|| (is a row shift needed? may the column scaling ride in the exp?), and
        # whether a class weight has norm <= eps (for the backward's radial part).
        top_target, smallest_norm, log_norm_range = torch.stack(
            [t.max() if t.numel() else t.new_zeros(()), norm.min(), log_norm.abs().max()]
        ).tolist()
        ctx.degenerate_weight = smallest_norm <= _NORM_EPS
        largest = max(max_abs_logit, top_target)
        terms = logits.shape[1]
        # The backward wants E_ij / ||W_j||. While the exponents stay in range, exp(L_ij / ||W_j||
        # - log ||W_j||) is that in the forward's own pass (and Z_i = sum_j that * ||W_j||, a
        # matrix-vector product as cheap as the row sum): one (N, C) pass fewer.
        ctx.column_scaled = terms >= 2 and not needs_row_shift(largest + log_norm_range, logits.dtype, terms=terms)
        shift = torch.zeros_like(t)
        if ctx.column_scaled:
            exp = torch.addcmul(log_norm.neg_(), logits, inv_norm, out=logits).exp_()  # (N, C) E diag(inv)
        else:
            logits.mul_(inv_norm)  # (N, C) the cosines times the scale
            if terms < 2 or needs_row_shift(largest, logits.dtype, terms=terms):
                # (N,) >= every term of the row, and one of them: Z_i >= 1 cannot underflow.
                shift = torch.maximum(logits.amax(dim=1), t) if target_in_denominator else logits.amax(dim=1)
                logits.sub_(shift.unsqueeze(1))
            exp = logits.exp_()  # (N, C) in the matmul's buffer; the target column is exp(-inf) = 0
        # (N,) the target's term of Z_i; 0 for the NCA form (Proxy-NCA), whose Z sums the others only.
        target_exp = (t - shift).exp_() if target_in_denominator else torch.zeros_like(t)
        row_sum = (torch.mv(exp, clamped) if ctx.column_scaled else exp.sum(dim=1)).add_(target_exp)  # (N,) Z_i
        loss = (row_sum.log() + shift - t).mean()
        if not any(ctx.needs_input_grad):  # no backward will read the buffer
            workspace.give_back("logits", exp)
            return loss
        ctx.save_for_backward(features, weight, norm, inv_norm, labels, exp, row_sum, target_exp)
        ctx.graph, ctx.workspace = graph, workspace
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss):
        if getattr(ctx, "graph", None) is None:
            raise RuntimeError(
                "cosine_margin_cross_entropy supports one backward pass (retain_graph=True is not supported)"
            )
        features, weight, norm, inv_norm, labels, exp, row_sum, target_exp = ctx.saved_tensors
        graph, ctx.graph = ctx.graph, None
        workspace = ctx.workspace
        row_scale = (grad_loss / exp.shape[0] / row_sum).unsqueeze(1)  # (N, 1) a_i: softmax = E_ij / Z_i
        # d loss / d t_i = a_i (exp(t_i - m_i) - Z_i). Differentiate target_logit with the a_i
        # left out: the target column then joins E below and meets a_i on the thin side.
        # The radius's gradient gets each row's a_i back before the rows are summed.
        grad_raw, grad_radius = graph.grads(target_exp - row_sum, radius_factor=row_scale.squeeze(1))  # b_i / a_i
        # E' = E diag(inv) in place (the saved buffer is not read again: one backward only), and
        # the target column (exp 0 so far) set to b_i inv_{y_i} / a_i, so that the two matmuls
        # below carry the target's gradient too: no sparse (N, D) or (C, D) updates.
        scaled = exp if ctx.column_scaled else exp.mul_(inv_norm)
        column = labels.unsqueeze(1)
        scaled.scatter_(1, column, (grad_raw.to(scaled.dtype) * inv_norm[labels]).unsqueeze(1))
        grad_features = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_features = (scaled @ weight).mul_(row_scale)  # (N, D)
        if ctx.needs_input_grad[1]:
            # (C, D)
            grad_weight = _weight_grad_via_workspace(
                scaled, features * row_scale, weight, norm, workspace, ctx.degenerate_weight
            )
        workspace.give_back("logits", scaled)  # read for the last time by the matmuls above
        return grad_features, grad_weight, None, grad_radius, None, None, None, None


def cosine_margin_cross_entropy(
    features,
    weight,
    labels,
    target_logit,
    radius,
    max_abs_logit,
    workspace: Workspace | None = None,
    target_in_denominator: bool = True,
) -> torch.Tensor:
    """``margin_cross_entropy(cosine_logits(features, weight), ...)`` fused: same value and gradients, faster.

    With ``U_j = W_j / ||W_j||``, ``r_i = radius[i]`` (or one number)::

        logit_ij = features_i . U_j                          for j != y_i
        logit_iy = r_i * target_logit(features_i . U_y / r_i)
        loss = mean_i -log softmax(logit_i)[y_i]

    ``target_in_denominator=False`` leaves the target out of the softmax's sum, the NCA form
    of Proxy-NCA: ``loss = mean_i (log sum_{j != y_i} exp(logit_ij) - logit_iy)``.
    ``max_abs_logit`` bounds ``|features_i . U_j|`` (the scale, or the largest feature norm):
    up to 60 in fp32 the ``exp`` needs no row-max subtraction (see
    :func:`~sslkit.losses._common.needs_row_shift`). Gradients flow to ``features``,
    ``weight`` and ``radius``; one backward pass only. Call inside :func:`full_precision`.
    A :class:`~sslkit.losses._workspace.Workspace` kept by the caller lets the (N, C) and
    (C, D) temporaries reuse last call's memory on the CPU (each head keeps one).

    Shape:
        features: (N, D); weight: (C, D); labels: (N,) in [0, C); radius: float, 0-d or (N,).
        target_logit: callable (N,) -> (N,) on cosines. Returns a scalar.
    """
    radius = torch.as_tensor(radius, dtype=features.dtype, device=features.device)
    workspace = workspace if workspace is not None else Workspace()
    target_in_denominator = check_flag(target_in_denominator, "target_in_denominator")
    return _CosineMarginCE.apply(
        features, weight, labels, radius, target_logit, float(max_abs_logit), workspace, target_in_denominator
    )


class MarginSoftmaxHead(Head):
    """Base of the cosine-softmax heads: own class weights, a margin on the target logit.

    The logits are ``r_i * cos(theta_ij)`` with ``cos`` between the embedding and the class
    weight, ``r_i = scale`` (or ``||x_i||`` when ``normalize_features`` is False, times
    ``||W_j||`` when ``normalize_weights`` is False), and the target logit changed to
    ``r_i * target_logit(cos(theta_iy))``; the loss is their cross-entropy, averaged over N.
    ``logits()`` returns the same matrix without the margin.

    The weight is stored (C, D) as in ``nn.Linear`` (pytorch-metric-learning stores ``W`` as
    (D, C)). It is a parameter: under DDP it is averaged like the backbone, no gather needed.
    With a :class:`~sslkit.losses.partial_fc.PartialFC` (a head's ``partial_fc=True``) it is
    this process's block of the rows instead, the loss is Partial FC's, and ``logits`` gathers
    the whole weight (every process must call it).

    Args:
        embedding_dim: D.
        num_classes: C.
        partial_fc: the block of classes this process holds and samples from; None holds every class.

    Shape:
        embeddings: (N, D), any float dtype (the math runs in fp32, fp64 stays fp64).
        labels: (N,) integer class ids in [0, C).
        returns: scalar loss; ``logits(embeddings)`` is (N, C).

    A head sets ``scale`` and overrides ``target_logit``:

    >>> class HalfCosFace(MarginSoftmaxHead):
    ...     scale = 30.0
    ...     def target_logit(self, cos_target):
    ...         return cos_target - 0.2
    >>> head = HalfCosFace(embedding_dim=16, num_classes=10)
    >>> head(torch.randn(8, 16), torch.randint(0, 10, (8,))).shape
    torch.Size([])
    """

    normalize_features: bool = True
    normalize_weights: bool = True
    scale: float = 1.0

    def __init__(self, embedding_dim: int, num_classes: int, partial_fc: torch.nn.Module | None = None) -> None:
        super().__init__(embedding_dim, num_classes)
        rows = partial_fc.rows if partial_fc is not None else self.num_classes
        self.weight = torch.nn.Parameter(torch.empty(rows, self.embedding_dim))
        if partial_fc is None:
            torch.nn.init.xavier_uniform_(self.weight)
        else:
            if not (self.normalize_features and self.normalize_weights):
                raise ValueError(f"partial_fc needs unit features and weights; {type(self).__name__} keeps norms")
            self.partial_fc, self.sharded_parameters = partial_fc, ("weight",)
            bound = math.sqrt(6.0 / (self.num_classes + self.embedding_dim))  # xavier_uniform_ of the whole (C, D)
            partial_fc.init_rows(self.weight, lambda rows, seeded: rows.uniform_(-bound, bound, generator=seeded))
        self.workspace = Workspace()  # scratch memory of the fused loss, reused between steps

    def target_logit(self, cos_target: torch.Tensor) -> torch.Tensor:
        """The margin: (N,) cosines of the true class -> their replacement (before scaling)."""
        return cos_target

    def _features(self, embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | float]:
        """The (N, D) features the class weights meet, in fp32 or fp64, and their radius ``r``.

        ``scale * x / ||x||`` and ``r = scale`` when ``normalize_features``; ``x`` and
        ``r_i = ||x_i||`` otherwise. Scaling the (N, D) features rather than the (N, C) product
        is one pass over fewer numbers.
        """
        dtype = torch.promote_types(upcast(embeddings).dtype, upcast(self.weight).dtype)
        x = embeddings.to(dtype)
        if self.normalize_features:
            return _scaled_unit_rows(x, self.scale), self.scale
        return x, torch.linalg.vector_norm(x, dim=1)

    def _scaled_logits(
        self, embeddings: torch.Tensor, labels: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | float]:
        """(N, C) logits ``r_i * cos_ij`` (no margin) and the target radius ``r`` (float or (N,)).

        With ``labels`` this is the loss path: ``r`` includes ``||W_{y_i}||`` for heads that keep
        the weight norms, and the logits must go straight into :func:`margin_cross_entropy`
        (their backward then scales its gradient in place). Call inside :func:`full_precision`.
        """
        features, radius = self._features(embeddings)
        weight = self.weight.to(features.dtype)
        if self.partial_fc is not None:
            weight = self.partial_fc.gather_rows(weight)
        if self.normalize_weights:
            # With labels this is the loss path: the logits go straight into margin_cross_entropy.
            private = labels is not None
            return cosine_logits(features, weight, private, self.workspace if private else None), radius  # (N, C)
        if labels is not None:
            radius = radius * torch.linalg.vector_norm(weight[labels], dim=1)
        return features @ weight.T, radius  # (N, C)

    def logits(self, embeddings: torch.Tensor) -> torch.Tensor:
        """(N, D) -> (N, C) inference logits: scaled cosines, no margin."""
        self.check_inputs(embeddings)
        with full_precision(embeddings.device):
            return self._scaled_logits(embeddings)[0]

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        labels = self.check_inputs(embeddings, labels)
        if self.partial_fc is not None:
            weight, workspace = self.weight, self.workspace
            return self.partial_fc.loss(embeddings, labels, weight, self.scale, self.target_logit, True, workspace)
        with full_precision(embeddings.device):
            if self.normalize_weights:
                features, radius = self._features(embeddings)
                weight = self.weight.to(features.dtype)
                max_abs_logit = (
                    self.scale if self.normalize_features else float(radius.detach().amax()) if len(radius) else 0.0
                )
                return cosine_margin_cross_entropy(
                    features, weight, labels, self.target_logit, radius, max_abs_logit, self.workspace
                )
            logits, radius = self._scaled_logits(embeddings, labels)
            return margin_cross_entropy(logits, labels, self.target_logit, radius)
