"""Encoders and heads: backbones (torchvision ResNets, any timm model), MLP heads, global BatchNorm, weights on disk.

- :mod:`sslkit.models.backbones`       backbones and MLP heads built from a recipe's ``model`` section.
- :mod:`sslkit.models.sync_batchnorm`  BatchNorm over the global batch of every process.
- :mod:`sslkit.models.weights`         backbone exports, a run's checkpointed weights, ``run.init_from``.
- :mod:`sslkit.models.export`          safetensors, timm and ONNX exports that carry their input, loaded back.
- :mod:`sslkit.models.expected_input`  the input an export expects (size, mean, std, resize) and its preprocessing.
- :mod:`sslkit.models.model_card`      an export's model card (README.md).
"""

from sslkit.models.backbones import (
    BACKBONES,
    TIMM_PREFIX,
    ScaledResNet,
    backbone_from_config,
    build_backbone,
    build_mlp,
    build_timm_backbone,
    check_backbone,
    count_parameters,
    describe,
    freeze_patch_embedding,
    notes,
    timm_name,
    to_channels_last,
)

__all__ = [
    "BACKBONES",
    "TIMM_PREFIX",
    "ScaledResNet",
    "backbone_from_config",
    "build_backbone",
    "build_mlp",
    "build_timm_backbone",
    "check_backbone",
    "count_parameters",
    "describe",
    "freeze_patch_embedding",
    "notes",
    "timm_name",
    "to_channels_last",
]
