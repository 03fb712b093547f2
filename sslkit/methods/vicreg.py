"""VICReg (Bardes, Ponce, LeCun 2022): variance, invariance and covariance terms on the two views' embeddings.

References:
    [0] VICReg, Bardes, Ponce, LeCun 2022, https://arxiv.org/abs/2105.04906 (section 3 and 4)
    [1] The authors' code, https://github.com/facebookresearch/vicreg (main_vicreg.py)
"""

from __future__ import annotations

from sslkit.methods.simclr import ProjectedViews


class VICReg(ProjectedViews):
    """VICReg [0]: :class:`~sslkit.losses.VICRegLoss` on the expander outputs ``g(f(v1))`` and ``g(f(v2))``.

    The invariance term pulls the two views' embeddings together; the variance and covariance
    terms, statistics of the global batch (every process's images), keep each feature's standard
    deviation up and the features decorrelated. Weights 25 / 25 / 1 in [0]
    (``loss.invariance_weight``, ``variance_weight``, ``covariance_weight``). No negatives, no
    predictor and no momentum encoder. The expander (``model.projector_*``) is 3 layers, 8192
    wide at ImageNet scale in [0]. Both views go through the encoder in one batch, as in
    :class:`~sslkit.methods.SimCLR`.

    Multi-crop (``augment.local_views``): the local views go through the backbone in a batch of
    their own and the expander sees every view; the loss is
    :func:`~sslkit.losses.vicreg.multi_view_vicreg_loss`, the mean of the two-view loss over the
    pairs of a global view with another view, (1, 2), (1, l) and (2, l), each view's variance and
    covariance over the global batch (a global view's then count in every pair it is in); with two
    views, the loss above.

    Shape:
        view1, view2: (B, C, H, W); local_views: (B, C, L, L) each; returns a scalar loss.
    """

    loss_names = ("vicreg",)
    takes_local_views = True
    min_batch_reason = "takes each feature's variance and covariance over the global batch (divided by N - 1)"
