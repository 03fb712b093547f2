"""Barlow Twins (Zbontar et al. 2021): the cross-correlation of the two views' projections to the identity.

References:
    [0] Barlow Twins, Zbontar et al. 2021, https://arxiv.org/abs/2103.03230 (section 2 and 4)
    [1] The authors' code, https://github.com/facebookresearch/barlowtwins (main.py)
"""

from __future__ import annotations

from sslkit.methods.simclr import ProjectedViews


class BarlowTwins(ProjectedViews):
    """Barlow Twins [0]: :class:`~sslkit.losses.BarlowTwinsLoss` on the projections ``g(f(v1))`` and ``g(f(v2))``.

    The loss standardises each feature over the global batch (every process's images) and drives
    the cross-correlation of the two views to the identity, weighting the off-diagonal terms by
    ``loss.off_diagonal_weight`` (``lambda``, 5e-3 in [0]). No negatives, no predictor and no
    momentum encoder. The projector (``model.projector_*``) is 3 layers, 8192 wide at ImageNet
    scale in [0]: the loss's statistics need many features ([0], figure 4). Both views go through
    the encoder in one batch, as in :class:`~sslkit.methods.SimCLR`.

    Multi-crop (``augment.local_views``): the local views go through the backbone in a batch of
    their own and the projector sees every view; the loss is
    :func:`~sslkit.losses.barlow_twins.multi_view_barlow_twins_loss`, the mean of the two-view loss
    over the pairs of a global view with another view, (1, 2), (1, l) and (2, l), each pair's
    statistics over the global batch; with two views, the loss above.

    Shape:
        view1, view2: (B, C, H, W); local_views: (B, C, L, L) each; returns a scalar loss.
    """

    loss_names = ("barlow_twins",)
    takes_local_views = True
    min_batch_reason = "standardises each feature over the global batch, and one image has no spread to standardise"
