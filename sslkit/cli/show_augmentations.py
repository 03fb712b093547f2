"""Save a grid of a recipe's augmented views, to see what the encoder will be shown.

    sslkit-show-augmentations RECIPE [key.sub=value ...] [--out PATH] [--images N] [--views K]
    sslkit-show-augmentations recipes/quickstart.yaml augment.crop_scale=[0.08,1.0]

Each row is one training image (resized to the crop size), then K augmented views of it, as
:class:`sslkit.augment.TwoViewAugment` makes them (normalisation undone for display). A
user's mistake prints one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sslkit.cli.early_checks import recipe_with_overrides
from sslkit.console import console, print_user_error
from sslkit.errors import UserError

# sslkit.config, torch, torchvision and kornia are imported where they are used: --help answers at once, not
# after seconds.
if TYPE_CHECKING:
    import torch

    from sslkit.augment import EvalTransform, TwoViewAugment


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="sslkit-show-augmentations", description="Save a PNG grid of a recipe's augmented views."
    )
    parser.add_argument(
        "recipe", help="a YAML recipe's path or a bundled recipe's name, e.g. recipes/quickstart.yaml or quickstart"
    )
    parser.add_argument("overrides", nargs="*", default=[], help="dotted key=value overrides, e.g. augment.blur_p=1.0")
    parser.add_argument(
        "--out", type=Path, default=None, help="PNG to write (default: outputs/augmentations-<run name>.png)"
    )
    parser.add_argument("--images", type=int, default=8, help="rows: how many training images (default 8)")
    parser.add_argument("--views", type=int, default=6, help="augmented views per image (default 6)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: the recipe's run.seed)")
    # Intermixed: overrides may come before or after the --options, as users type them.
    return parser.parse_intermixed_args(argv)


def first_images(dataset, count: int):
    """The first ``count`` images of a dataset as one uint8 (N, C, H, W) batch, or a padded batch of
    images of different sizes (image folders, shards)."""
    import torch

    count = min(count, len(dataset))
    if hasattr(dataset, "images"):
        return dataset.images[:count]
    if hasattr(dataset, "configure"):  # tar shards: the first batch of the stream
        dataset.configure(count, rank=0, world=1, workers=0, seed=0)
        return next(iter(dataset))[0]
    if hasattr(dataset, "__getitems__"):
        return dataset.__getitems__(list(range(count)))[0]
    return torch.stack([dataset[i][0] for i in range(count)])


def augmentation_grid(
    images: torch.Tensor,
    augment: TwoViewAugment,
    original: EvalTransform,
    views: int,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    normalized: bool,
) -> torch.Tensor:
    """Rows of [original, view 1, ..., view K, local view 1, ..., local view L] in [0, 1], for
    ``torchvision.utils.save_image``; the L local views (multi-crop) are enlarged to S with nearest pixels.

    Shape:
        images: (N, C, H, W) uint8; returns (N * (K + L + 1), C, S, S).
    """
    import torch

    made, local = [], []
    for _ in range((views + 1) // 2):  # each call makes two global views (and the local ones)
        global_1, global_2, *local_views = augment(images)
        made += [global_1, global_2]
        local = local or local_views
    size = made[0].shape[-1]
    local = [torch.nn.functional.interpolate(view, size=size, mode="nearest") for view in local]
    columns = [original(images), *made[:views], *local]  # (K + L + 1) tensors of shape (N, C, S, S)
    if normalized:
        mean_ = torch.tensor(mean).view(1, -1, 1, 1)
        std_ = torch.tensor(std).view(1, -1, 1, 1)
        columns = [column * std_ + mean_ for column in columns]
    grid = torch.stack(columns, dim=1)  # (N, K + 1, C, S, S): image-major, so each row is one image
    return grid.flatten(0, 1).clamp(0.0, 1.0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.images < 1 or args.views < 1:
            raise UserError(f"--images and --views must be >= 1, got --images {args.images} --views {args.views}")
        recipe_with_overrides(args.recipe, args.overrides)  # before torch is imported
        from sslkit.config import load_config
        from sslkit.datasets import build_dataset

        cfg = load_config(args.recipe, args.overrides)

        d = cfg.data
        dataset = build_dataset(d.name, "train", d.root, d.download, d.image_size, d.max_size)
    except UserError as error:
        print_user_error(error)
        return 2

    import torch
    from torchvision.utils import save_image

    from sslkit.augment import EvalTransform, TwoViewAugment

    info = dataset.info
    torch.manual_seed(cfg.run.seed if args.seed is None else args.seed)
    a = cfg.augment
    augment = TwoViewAugment(a, info.channels, info.mean, info.std)
    original = EvalTransform(a.image_size, info.channels, info.mean, info.std, a.normalize)
    images = first_images(dataset, args.images)
    grid = augmentation_grid(images, augment, original, args.views, info.mean, info.std, a.normalize)

    out = args.out or Path("outputs") / f"augmentations-{cfg.run.name}.png"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):  # a file where a folder of the path should be
        print_user_error(
            UserError(
                f"--out {out}: its folder {out.parent} cannot be made, a file is in the way; choose another --out"
            )
        )
        return 2
    # A little upscaling so 16x16 crops are visible; nearest keeps the pixels honest.
    scale = max(1, 64 // a.image_size)
    if scale > 1:
        grid = torch.nn.functional.interpolate(grid, scale_factor=scale, mode="nearest")
    save_image(grid, out, nrow=args.views + 1 + a.local_views, padding=2, pad_value=1.0)
    local = f" + {a.local_views} local views" if a.local_views else ""
    console.print(
        f"{len(images)} images x (original + {args.views} views{local}) from {cfg.data.name} -> [bold]{out}[/]",
        soft_wrap=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
