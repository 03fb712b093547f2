"""sslkit: contrastive self-supervised pretraining and metric learning.

The package is organised one idea per module:

- :mod:`sslkit.schema`      the recipe's typed dataclasses: YAML and dotted overrides in, plain data out.
- :mod:`sslkit.config`      loading a recipe for a user, checked against every registry (``load_config``).
- :mod:`sslkit.datasets`    datasets, their samplers and splits: uint8 image batches for the accelerator.
- :mod:`sslkit.augment`     kornia two-view augmentation on the accelerator's device.
- :mod:`sslkit.models`      torchvision ResNet and timm backbones, MLP heads, weights on disk.
- :mod:`sslkit.losses`      every loss, one per file, one registry (``sslkit.losses.build``).
- :mod:`sslkit.distributed` rank helpers and the gradient-carrying all-gather.
- :mod:`sslkit.optim`       optimizers (SGD, AdamW, LARS) and schedules as pure functions.
- :mod:`sslkit.loop`        the Accelerate training loop, its state, logs, run directory and launch.
- :mod:`sslkit.evaluation`  weighted kNN, linear probe and retrieval.
- :mod:`sslkit.experiments` experiments over many runs, reports and plots.
- :mod:`sslkit.cli`         the commands: parse, call the library, print.
"""

__version__ = "0.1.0"
