"""Backbones (torchvision ResNets, optionally narrow and with a CIFAR stem, or any timm model) and MLP heads.

Why a subclass of torchvision's ``ResNet`` rather than a hand-written network: the blocks,
initialisation and ``state_dict`` keys stay torchvision's, so an exported backbone loads
into ``torchvision.models.resnet18()`` (with ``fc = nn.Identity()``, and the same stem).
torchvision hard-codes 64 channels in the first stage; ``width`` scales every stage so a
ResNet-18 small enough for a CPU (width 16: 0.7M parameters) is the same architecture.

Any other ``model.backbone`` is a timm model (``vit_small_patch16_224``, ``convnext_tiny``), built
without pretrained weights and without its classifier, so it too returns pooled features; a
``timm/`` prefix (``timm/resnet50``) picks timm's model where sslkit has one of the same name.
:func:`backbone_from_config` builds either from a recipe's ``model`` section, and
:func:`check_backbone` checks that section when a recipe is loaded.
"""

from __future__ import annotations

import difflib
import re

import torch
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

from sslkit.errors import UserError

BACKBONES = {
    "resnet18": (BasicBlock, [2, 2, 2, 2]),
    "resnet34": (BasicBlock, [3, 4, 6, 3]),
    "resnet50": (Bottleneck, [3, 4, 6, 3]),
}


class ScaledResNet(ResNet):
    """torchvision ResNet whose stage widths are ``width * (1, 2, 4, 8)`` instead of 64 * (...).

    The classifier ``fc`` is replaced by ``nn.Identity``: ``forward`` returns pooled features.

    Shape:
        x: (B, in_channels, H, W) -> (B, feature_dim) with ``feature_dim = 8 * width * expansion``.
    """

    def __init__(self, block, layers: list[int], width: int = 64, in_channels: int = 3, cifar_stem: bool = False):
        self._width = width
        super().__init__(block, layers)
        # torchvision built the stem for 3 -> 64 channels; rebuild it for in_channels -> width.
        if cifar_stem:
            # 3x3 stride 1 and no max-pool: a 32x32 image keeps enough resolution (SimCLR appendix B.9).
            self.conv1 = nn.Conv2d(in_channels, width, kernel_size=3, stride=1, padding=1, bias=False)
            self.maxpool = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(in_channels, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        nn.init.kaiming_normal_(self.conv1.weight, mode="fan_out", nonlinearity="relu")
        self.feature_dim = 8 * width * block.expansion
        self.in_channels = in_channels
        self.fc = nn.Identity()

    def group_matcher(self, coarse: bool = False) -> dict[str, str]:
        """Parameter groups from the input up, in timm's form (its ResNets have the same names): the stem, then
        each residual block (each stage when ``coarse``). Layer-wise lr decay reads them (:mod:`sslkit.optim`)."""
        return {"stem": r"^conv1|^bn1", "blocks": r"^layer(\d+)" if coarse else r"^layer(\d+)\.(\d+)"}

    def _make_layer(self, block, planes, blocks, stride=1, dilate=False):
        if planes == 64:  # the first stage: its input is the stem's output
            self.inplanes = self._width
        return super()._make_layer(block, planes * self._width // 64, blocks, stride, dilate)


def build_backbone(name: str, width: int = 64, cifar_stem: bool = False, in_channels: int = 3) -> ScaledResNet:
    """A ResNet by name (see ``BACKBONES``) returning pooled features; ``.feature_dim`` says their size."""
    if name not in BACKBONES:
        raise ValueError(f"backbone must be one of {sorted(BACKBONES)}, got {name!r}")
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    block, layers = BACKBONES[name]
    return ScaledResNet(block, layers, width=width, in_channels=in_channels, cifar_stem=cifar_stem)


# --------------------------------------------------------------------------- timm models

TIMM_PREFIX = "timm/"
# create_model arguments sslkit sets itself, and why a recipe cannot.
_NO_DOWNLOAD = "sslkit builds timm models without pretrained weights; start from weights with run.init_from"
_SET_BY_SSLKIT = {
    "pretrained": _NO_DOWNLOAD,
    "pretrained_cfg": _NO_DOWNLOAD,
    "pretrained_cfg_overlay": _NO_DOWNLOAD,
    "checkpoint_path": _NO_DOWNLOAD,
    "num_classes": "sslkit sets num_classes=0: the backbone returns pooled features, the heads come from the method",
    "in_chans": "sslkit sets in_chans to the data's channels",
}


def timm_name(backbone: str) -> str | None:
    """The timm model that ``model.backbone`` names, or None for one of sslkit's ResNets (:data:`BACKBONES`).

    >>> timm_name("resnet50"), timm_name("timm/resnet50"), timm_name("convnext_tiny")
    (None, 'resnet50', 'convnext_tiny')
    """
    if backbone in BACKBONES:
        return None
    return backbone.removeprefix(TIMM_PREFIX)


def build_timm_backbone(name: str, in_channels: int = 3, kwargs: dict | None = None) -> nn.Module:
    """timm's model ``name`` without pretrained weights or classifier: ``forward`` returns pooled features.

    ``kwargs`` go to ``timm.create_model`` (``img_size``, ``patch_size``, ``depth``, ...). Like
    :class:`ScaledResNet`, the model gets ``.feature_dim`` (the size of its features, read from the
    model) and ``.in_channels``; its ``state_dict`` keys stay timm's, so an exported backbone loads
    into ``timm.create_model(name, num_classes=0, in_chans=in_channels, **kwargs)``.

    Raises:
        UserError: one line for an argument the model does not take or cannot be built with.
    """
    model = _create_timm(name, in_channels, dict(kwargs or {}))
    model.feature_dim = _timm_feature_dim(model)
    model.in_channels = in_channels
    return model


def backbone_from_config(model_cfg, in_channels: int) -> nn.Module:
    """The backbone a recipe's ``model`` section describes, for images of ``in_channels`` channels.

    sslkit's ResNets (``resnet18``, ``resnet34``, ``resnet50``) with ``model.width`` and
    ``model.cifar_stem``; any other name (or one with a ``timm/`` prefix) is a timm model with
    ``model.kwargs``. Either returns pooled features of size ``.feature_dim``.
    """
    name = timm_name(model_cfg.backbone)
    if name is None:
        return build_backbone(model_cfg.backbone, model_cfg.width, model_cfg.cifar_stem, in_channels)
    backbone = build_timm_backbone(name, in_channels, model_cfg.kwargs)
    if model_cfg.freeze_patch_embed:
        freeze_patch_embedding(backbone)
    return backbone


def freeze_patch_embedding(backbone: nn.Module) -> None:
    """Keep a ViT's patch projection at its random initialisation (MoCo v3, Chen et al. 2021, section 4.2):
    the instability of ViT training shows first as gradient spikes in this layer, and a fixed random
    projection removes them at no cost in accuracy. Its parameters get no gradient and no optimizer
    state; they stay in the ``state_dict`` (and the momentum encoder's copy stays equal to them)."""
    backbone.patch_embed.proj.requires_grad_(False)


def describe(model_cfg) -> str:
    """The settings that decide a backbone's weights, as overrides spell them (for messages)."""
    if timm_name(model_cfg.backbone) is None:
        return f"model.backbone={model_cfg.backbone} width={model_cfg.width} cifar_stem={model_cfg.cifar_stem}"
    kwargs = ", ".join(f"{key}: {value}" for key, value in model_cfg.kwargs.items())
    return f"model.backbone={model_cfg.backbone} model.kwargs={{{kwargs}}}"


def notes(model_cfg) -> list[str]:
    """Notes on ``model.*`` settings that have no effect on this backbone (printed when a run starts)."""
    if timm_name(model_cfg.backbone) is None:
        return []
    defaults = type(model_cfg)()
    ignored = [
        f"model.{key}={getattr(model_cfg, key)}"
        for key in ("width", "cifar_stem")
        if getattr(model_cfg, key) != getattr(defaults, key)
    ]
    if not ignored:
        return []
    return [
        f"{' and '.join(ignored)} {'applies' if len(ignored) == 1 else 'apply'} to sslkit's ResNets only; the timm "
        f"model {model_cfg.backbone} ignores {'it' if len(ignored) == 1 else 'them'} (its own arguments go in "
        "model.kwargs)"
    ]


def check_backbone(model_cfg, image_size: int, source: str = "recipe", local_size: int | None = None) -> None:
    """One line for a ``model`` section that cannot build a backbone for ``image_size`` x ``image_size`` images
    (and ``local_size`` ones: multi-crop's local views).

    For sslkit's ResNets: no ``model.kwargs``. For a timm model: a known name (else the close
    matches), arguments the model takes, and an input it runs on: a ViT's patch size divides the
    image size, and a model built for a fixed size is built for this one; local views of another size
    need ``dynamic_img_size`` (timm interpolates the position embeddings). The model is built and
    run on the meta device (shapes only: no memory, no weights, no random numbers drawn), so a
    ViT-L is checked as fast as a ResNet-18.
    """
    name = timm_name(model_cfg.backbone)
    kwargs = model_cfg.kwargs
    if name is None and model_cfg.freeze_patch_embed:
        raise UserError(
            f"{source}: model.freeze_patch_embed=true needs a patch-embedding backbone (a timm ViT), but "
            f"model.backbone '{model_cfg.backbone}' is sslkit's ResNet; remove it or choose a ViT"
        )
    if name is None:
        if kwargs:
            raise UserError(
                f"{source}: model.kwargs {kwargs} are arguments of timm models, but model.backbone "
                f"'{model_cfg.backbone}' is sslkit's ResNet (set model.width and model.cifar_stem); "
                f"remove model.kwargs, or use timm's model with model.backbone={TIMM_PREFIX}{model_cfg.backbone}"
            )
        return
    import timm

    if not name or not timm.is_model(name):
        candidates = list(dict.fromkeys([*BACKBONES, *timm.list_models()]))
        close = difflib.get_close_matches(name, candidates, n=5, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UserError(
            f"{source}: unknown model.backbone '{model_cfg.backbone}'{hint} (sslkit's ResNets: "
            f"{', '.join(BACKBONES)}; or any timm model name, listed by timm.list_models())"
        )
    for key in kwargs:
        if key in _SET_BY_SSLKIT:
            raise UserError(f"{source}: model.kwargs.{key} cannot be set: {_SET_BY_SSLKIT[key]}")
    # fork_rng: a few models draw random numbers even on the meta device; loading a recipe must not.
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        try:
            model = _create_timm(name, 3, dict(kwargs), source, meta=True)
        except _MetaUnsupported:
            return  # checked when training builds it
        _check_image_size(model, model_cfg, image_size, source)
        if local_size is not None and local_size != image_size:
            _check_image_size(model, model_cfg, local_size, source, "augment.local_size")
        if model_cfg.freeze_patch_embed and not hasattr(getattr(model, "patch_embed", None), "proj"):
            raise UserError(
                f"{source}: model.freeze_patch_embed=true needs a model with a patch projection "
                f"(patch_embed.proj, as timm's ViTs have), and {model_cfg.backbone} has none; remove it"
            )
        try:
            features = model(torch.empty(2, 3, image_size, image_size))
        except Exception as error:  # whatever the model says about this input, in one line
            if "meta" in str(error):
                return
            raise UserError(
                f"{source}: model.backbone {model_cfg.backbone} does not run on augment.image_size={image_size} "
                f"images: {type(error).__name__}: {_one_line(error)}; use a larger augment.image_size or other "
                f"model.kwargs"
            ) from None
    dim = _timm_feature_dim(model)
    if tuple(features.shape) != (2, dim):
        raise UserError(
            f"{source}: model.backbone {model_cfg.backbone} gives features of shape {list(features.shape[1:])} per "
            f"image, not a vector of {dim}: keep its global pooling (remove model.kwargs.global_pool)"
        )


def _check_image_size(
    model: nn.Module, model_cfg, image_size: int, source: str, key: str = "augment.image_size"
) -> None:
    """A patch-embedding model (ViT, Swin, ...): its patches tile the image, and a fixed input size is this one;
    ``key`` names the setting that gives ``image_size``."""
    embed = getattr(model, "patch_embed", None)
    patch = getattr(embed, "patch_size", None)
    if patch is None:
        return
    patch = tuple(patch) if isinstance(patch, (tuple, list)) else (patch, patch)
    given = "model.kwargs.patch_size" if "patch_size" in model_cfg.kwargs else f"the name {model_cfg.backbone}"
    if any(image_size % side for side in patch):
        size = "x".join(str(side) for side in dict.fromkeys(patch))
        divisors = [d for d in range(2, min(image_size, 32) + 1) if image_size % d == 0]
        raise UserError(
            f"{source}: the patch size {size} (from {given}) does not divide {key}={image_size}: "
            f"the patches would not tile the image; set model.kwargs.patch_size to one of "
            f"{', '.join(map(str, divisors)) or image_size} or change {key}"
        )
    fixed = getattr(embed, "img_size", None)
    if fixed is not None and getattr(embed, "strict_img_size", False) and tuple(fixed) != (image_size, image_size):
        if key != "augment.image_size":
            raise UserError(
                f"{source}: model.backbone {model_cfg.backbone} is built for {'x'.join(map(str, fixed))} images, "
                f"and the local views ({key}={image_size}) are smaller: set model.kwargs.dynamic_img_size=true "
                f"(timm interpolates the position embeddings)"
            )
        given = "model.kwargs.img_size" if "img_size" in model_cfg.kwargs else "its default"
        size = "x".join(str(side) for side in fixed)
        raise UserError(
            f"{source}: model.backbone {model_cfg.backbone} is built for {size} images ({given}), "
            f"augment.image_size is {image_size}: set model.kwargs.img_size={image_size}"
        )


class _MetaUnsupported(Exception):
    """The model cannot be built on the meta device (an op without a meta kernel): not the recipe's fault."""


def _create_timm(name: str, in_channels: int, kwargs: dict, source: str | None = None, meta: bool = False):
    """``timm.create_model`` of a backbone; every failure is the recipe's name or ``model.kwargs``: one line."""
    import timm

    where = f"{source}: " if source else ""
    try:
        return timm.create_model(name, pretrained=False, num_classes=0, in_chans=in_channels, **kwargs)
    except Exception as error:
        text = _one_line(error)
        if meta and "meta" in text:
            raise _MetaUnsupported(text) from error
        unexpected = re.search(r"unexpected keyword argument '(\w+)'", text) if isinstance(error, TypeError) else None
        if unexpected:
            key = unexpected.group(1)
            raise UserError(
                f"{where}model.kwargs.{key}: timm's {name} takes no argument '{key}' ({text}); remove it"
            ) from None
        raise UserError(
            f"{where}timm cannot build {name} with model.kwargs {kwargs}: {type(error).__name__}: {text}"
        ) from None


def _timm_feature_dim(model: nn.Module) -> int:
    """What ``forward`` returns per image without a classifier: ``head_hidden_size`` where a model has a
    pre-logits layer (MobileNetV3's 1280 after 960 channels), else ``num_features``."""
    return int(getattr(model, "head_hidden_size", None) or model.num_features)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def build_mlp(
    in_dim: int, hidden_dim: int, out_dim: int, num_layers: int = 2, last_batch_norm: bool = False
) -> nn.Sequential:
    """Projection / prediction head: ``num_layers`` linear layers, BatchNorm + ReLU between them.

    SimCLR uses 2 layers (2048 -> 128), MoCo v3 3 layers with a BatchNorm after the last
    (``last_batch_norm``, affine-free as in its code).

    Shape:
        (B, in_dim) -> (B, out_dim)
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    layers: list[nn.Module] = []
    dim = in_dim
    for _ in range(num_layers - 1):
        # No bias before BatchNorm: the norm's shift makes it redundant.
        layers += [nn.Linear(dim, hidden_dim, bias=False), nn.BatchNorm1d(hidden_dim), nn.ReLU(inplace=True)]
        dim = hidden_dim
    layers.append(nn.Linear(dim, out_dim, bias=not last_batch_norm))
    if last_batch_norm:
        layers.append(nn.BatchNorm1d(out_dim, affine=False))
    return nn.Sequential(*layers)


def count_parameters(module: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def to_channels_last(module: nn.Module) -> nn.Module:
    """channels_last memory format: faster convolutions on GPUs with tensor cores (and oneDNN on CPU)."""
    return module.to(memory_format=torch.channels_last)
