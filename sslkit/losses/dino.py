"""DINO: cross-entropy of the student's views against the centred, sharpened teacher's global views.

References:
    [0] DINO, Caron et al. 2021, https://arxiv.org/abs/2104.14294 (eq. 1-3, Algorithm 1,
        the implementation details for the temperatures)
    [1] The authors' code, https://github.com/facebookresearch/dino (main_dino.py, ``DINOLoss``)

The DINO projection head (3-layer MLP, bottleneck, weight-normalised last layer, frozen for the
first epoch) belongs to the model and the method that trains it, not to the loss: this module
only sees its outputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sslkit import distributed
from sslkit.losses._common import as_number, check_flag, check_positive, check_tensor, full_precision, upcast
from sslkit.losses.head import check_positive_int


def dino_teacher_temperature(
    epoch: int, teacher_temperature: float = 0.07, warmup_teacher_temperature: float = 0.04, warmup_epochs: int = 30
) -> float:
    """The teacher temperature at ``epoch``: a linear warm-up, then constant ([0], implementation details; [1]).

    ``warmup_teacher_temperature`` at epoch 0, rising linearly to ``teacher_temperature`` at
    epoch ``warmup_epochs - 1`` (``numpy.linspace(warmup, final, warmup_epochs)[epoch]``, as the
    authors' code and lightly index it), ``teacher_temperature`` from then on. A pure function
    of the epoch, so a resumed run continues the schedule exactly.

    >>> dino_teacher_temperature(0), dino_teacher_temperature(29), dino_teacher_temperature(100)
    (0.04, 0.07, 0.07)
    """
    epoch = check_positive_int(epoch, "epoch", minimum=0)
    final = check_positive(teacher_temperature, "teacher_temperature")
    start = check_positive(warmup_teacher_temperature, "warmup_teacher_temperature")
    warmup_epochs = check_positive_int(warmup_epochs, "warmup_epochs", minimum=0)
    if epoch >= warmup_epochs:
        return final
    if warmup_epochs == 1:
        return start
    return start + (final - start) * epoch / (warmup_epochs - 1)


def _check_student_teacher(student: torch.Tensor, teacher: torch.Tensor, num_global_views: int) -> tuple[int, int]:
    """The number of images n and of student views V, or a ValueError saying what does not fit.

    Shape:
        student: (V n, K); teacher: (G n, K).
    """
    check_tensor(student, "student")
    check_tensor(teacher, "teacher")
    if student.dim() != 2 or teacher.dim() != 2 or student.shape[1] != teacher.shape[1]:
        shapes = f"{tuple(student.shape)} and {tuple(teacher.shape)}"
        raise ValueError(f"student and teacher must be 2-D (views x images, K) with the same K, got {shapes}")
    if not student.is_floating_point() or not teacher.is_floating_point():
        raise ValueError(f"student and teacher must be floating point, got {student.dtype} and {teacher.dtype}")
    rows, g = teacher.shape[0], num_global_views
    if rows < g or rows % g:
        raise ValueError(
            f"teacher must stack the {g} global views of n >= 1 images, [global 1; global 2]: "
            f"a multiple of {g} rows, got {rows}"
        )
    n = rows // g
    views = max(g, 2)  # every global view, and at least one other view to compare it with
    if student.shape[0] % n or student.shape[0] < views * n:
        raise ValueError(
            f"student must stack every view of the teacher's {n} images, the {g} global views first "
            f"([global 1; global 2; local 1; ...]): a multiple of {n} rows, at least {views * n}, "
            f"got {student.shape[0]}"
        )
    return n, student.shape[0] // n


def dino_loss(
    student: torch.Tensor,
    teacher: torch.Tensor,
    teacher_temperature: float = 0.07,
    student_temperature: float = 0.1,
    center: torch.Tensor | None = None,
    num_global_views: int = 2,
) -> torch.Tensor:
    """DINO's loss (eq. 3 of [0]) averaged as the authors' code averages it::

        P_t(x) = softmax((g_t(x) - c) / tau_t),    P_s(x') = softmax(g_s(x') / tau_s)     (eq. 1-2)
        L = mean over the pairs (x global, x' any view, x' != x) of
            mean over the images of H(P_t(x), P_s(x')),    H(a, b) = -sum_k a_k log b_k

    The teacher sees the G global views only, the student all V views; a global view is not
    compared with itself, which leaves ``G V - G`` pairs. The paper's eq. 3 sums over the pairs;
    the authors' code and lightly take the mean, and so does sslkit (the learning rates quoted
    with DINO are the code's). The teacher is a constant: no gradient flows into it or the centre.
    Computed in fp32 (fp64 stays fp64) under autocast, as every sslkit loss: a softmax over K
    outputs summed in half precision loses most of its digits.

    Args:
        student, teacher: see Shape.
        teacher_temperature: ``tau_t`` > 0 (see :func:`dino_teacher_temperature` for its warm-up).
        student_temperature: ``tau_s`` > 0.
        center: ``c``, subtracted from the teacher's outputs; None is no centring.
        num_global_views: G, the teacher's views, which are also the student's first G views.

    Shape:
        student: (V n, K), the student's outputs for every view of n images, stacked view by view,
            the global views first: ``[global 1; global 2; local 1; ...; local V-2]``.
        teacher: (G n, K), the teacher's outputs for the global views, ``[global 1; global 2]``.
        center: (K,), optional.
        returns: scalar.

    >>> student, teacher = torch.randn(6 * 4, 32), torch.randn(2 * 4, 32)  # 4 images, 6 views, 2 global
    >>> dino_loss(student, teacher).shape
    torch.Size([])
    """
    g = check_positive_int(num_global_views, "num_global_views")
    n, views = _check_student_teacher(student, teacher, g)
    teacher_temperature = check_positive(teacher_temperature, "teacher_temperature")
    student_temperature = check_positive(student_temperature, "student_temperature")
    k = student.shape[1]
    if center is not None:
        check_tensor(center, "center")
        if center.shape != (k,):
            raise ValueError(f"center must have shape ({k},) as the outputs' K, got {tuple(center.shape)}")
    with full_precision(student.device):
        dtype = torch.promote_types(upcast(student).dtype, upcast(teacher).dtype)
        teacher = upcast(teacher.detach()).to(dtype)
        if center is not None:
            teacher = teacher - center.detach().to(dtype)
        targets = F.softmax(teacher / teacher_temperature, dim=1).reshape(g, n, k)
        log_p = F.log_softmax(upcast(student).to(dtype) / student_temperature, dim=1).reshape(views, n, k)
        cross_entropy = -torch.einsum("gnk,vnk->gv", targets, log_p) / n  # (G, V): H averaged over images
        same_view = torch.eye(g, views, dtype=torch.bool, device=student.device)
        return cross_entropy[~same_view].mean()


class DINOLoss(nn.Module):
    """DINO's self-distillation loss [0] with its centre and teacher-temperature schedule.

    Call ``loss(student, teacher, epoch)``: :func:`dino_loss` with the teacher temperature of
    ``epoch`` (:func:`dino_teacher_temperature`) and the current centre; then the centre moves
    towards the mean teacher output of this batch ([0], section 3.1 and Algorithm 1)::

        c <- m c + (1 - m) mean over every process's teacher rows of g_t(x)

    after the loss, as in the authors' code, so a step's loss uses the centre of the steps before.
    The centre is a buffer: it is saved and restored with the state dict (exact resume), and with
    ``sync_center`` it is equal on every process by construction (``replicated_buffers``, so DDP
    does not re-send it).

    Args:
        output_dim: K, the size of the DINO head's output (65,536 in [0]); the centre's size.
        teacher_temperature: ``tau_t`` after the warm-up. 0.07 with a warm-up from 0.04 over 30
            epochs is the paper's (implementation details); the authors' code and lightly
            default to 0.04 flat.
        warmup_teacher_temperature: ``tau_t`` at epoch 0.
        warmup_epochs: epochs of the linear warm-up; 0 starts at ``teacher_temperature``.
        student_temperature: ``tau_s`` (0.1 in [0]).
        center_momentum: ``m`` in [0, 1) (0.9 in [0]).
        num_global_views: G, the views the teacher sees (2 in [0]).
        sync_center: average the teacher outputs of every process for the centre, as the authors'
            code does (one all-gather of K + 1 numbers per step). Off: each process keeps its own.

    Shape:
        student: (V n, K), every view, global views first; teacher: (G n, K); epoch: int >= 0;
        returns a scalar.

    >>> loss_fn = DINOLoss(output_dim=32)
    >>> student, teacher = torch.randn(6 * 4, 32), torch.randn(2 * 4, 32)
    >>> loss_fn(student, teacher, epoch=0).shape
    torch.Size([])
    """

    replicated_buffers = ("center",)

    def __init__(
        self,
        output_dim: int = 65536,
        teacher_temperature: float = 0.07,
        warmup_teacher_temperature: float = 0.04,
        warmup_epochs: int = 30,
        student_temperature: float = 0.1,
        center_momentum: float = 0.9,
        num_global_views: int = 2,
        sync_center: bool = True,
    ) -> None:
        super().__init__()
        self.output_dim = check_positive_int(output_dim, "output_dim")
        self.teacher_temperature = check_positive(teacher_temperature, "teacher_temperature")
        self.warmup_teacher_temperature = check_positive(warmup_teacher_temperature, "warmup_teacher_temperature")
        self.warmup_epochs = check_positive_int(warmup_epochs, "warmup_epochs", minimum=0)
        self.student_temperature = check_positive(student_temperature, "student_temperature")
        momentum = as_number(center_momentum, "center_momentum")
        if not 0 <= momentum < 1:
            raise ValueError(f"center_momentum must be in [0, 1), got {center_momentum}")
        self.center_momentum = momentum
        self.num_global_views = check_positive_int(num_global_views, "num_global_views")
        self.sync_center = check_flag(sync_center, "sync_center")
        self.register_buffer("center", torch.zeros(self.output_dim))

    def forward(self, student: torch.Tensor, teacher: torch.Tensor, epoch: int) -> torch.Tensor:
        temperature = dino_teacher_temperature(
            epoch, self.teacher_temperature, self.warmup_teacher_temperature, self.warmup_epochs
        )
        loss = dino_loss(student, teacher, temperature, self.student_temperature, self.center, self.num_global_views)
        self.update_center(teacher)
        return loss

    @torch.no_grad()
    def update_center(self, teacher: torch.Tensor) -> None:
        """``c <- m c + (1 - m) mean(teacher)``, the mean over the teacher rows of every process.

        Shape:
            teacher: (G n, K); n may differ between processes (the sum and count are gathered).
        """
        teacher = upcast(teacher.detach()).to(self.center.dtype)
        total = torch.cat([teacher.sum(dim=0), teacher.new_tensor([teacher.shape[0]])])  # (K + 1,)
        if self.sync_center:
            total = distributed.gather_no_grad(total.unsqueeze(0), check=False).sum(dim=0)  # one row per process
        self.center.mul_(self.center_momentum).add_(total[:-1] / total[-1], alpha=1 - self.center_momentum)

    def extra_repr(self) -> str:
        return (
            f"output_dim={self.output_dim}, teacher_temperature={self.teacher_temperature}, "
            f"warmup_teacher_temperature={self.warmup_teacher_temperature}, warmup_epochs={self.warmup_epochs}, "
            f"student_temperature={self.student_temperature}, center_momentum={self.center_momentum}, "
            f"num_global_views={self.num_global_views}, sync_center={self.sync_center}"
        )
