"""Throughput of sslkit's two-view augmentation against two peer ways of doing the same.

    python tools/bench/augment.py [--batch 256] [--size 32] [--repeats 5] [--threads N] [--out bench.json]
                                  [--local-views 6] [--local-size 16]

Three pipelines make two views of every image of one uint8 (B, 3, size, size) batch with the
SimCLR set of sslkit's default :class:`~sslkit.config.AugmentConfig` (crop, flip, colour
jitter, grayscale, blur, normalise):

- ``sslkit``: :class:`sslkit.augment.TwoViewAugment`, one call on the whole batch.
- ``torchvision-per-image``: ``torchvision.transforms.v2`` applied image by image in a Python
  loop, on uint8 tensors, as a DataLoader worker does it (the usual peer set-up).
- ``kornia-sequential``: ``nn.Sequential`` of ``kornia.augmentation`` modules with their default
  arguments for everything the recipe does not fix, called once per view.

A fourth, ``sslkit-multicrop``, is the same augmentation with multi-crop: the two global views and
``--local-views`` local views of ``--local-size`` (crop scale 0.05-0.4, DINO's), one batched call per
group of views. Its cost per view is set against the two-view path's (``per_view``): the local views'
share is the multi-crop call's time less the two-view call's, divided by the local views, and per
pixel it divides further by ``(local size / size)^2``.

The pipelines run side by side, round-robin within every repeat (so a load spike on a shared
machine hits all of them), after one warm-up call each; the table reports medians of wall time
and of this process's CPU time (the steadier figure where other jobs share the cores; with
more than one thread it sums the threads). Images/s counts source images, each turned into two
views, per wall-clock second.

Threads default to 1: per-core throughput is the fair unit against the per-image baseline,
which a DataLoader runs in single-threaded workers, one per core.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__" and __package__ in (None, ""):
    # Run as a script: the repository root first on the path. Not when a test imports this file
    # as a module, where sys.path[0] is the test process's own entry.
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import kornia  # noqa: E402
import kornia.augmentation as K  # noqa: E402
import torch  # noqa: E402
import torchvision  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from torch import nn  # noqa: E402
from torchvision.transforms import v2 as T  # noqa: E402

from sslkit.augment import TwoViewAugment, kernel_size_for  # noqa: E402
from sslkit.config import AugmentConfig  # noqa: E402

MEAN = (0.49, 0.48, 0.45)
STD = (0.25, 0.24, 0.26)


def torchvision_per_image(cfg: AugmentConfig):
    """The same set with torchvision.transforms.v2, applied one uint8 (C, H, W) image at a time."""
    kernel = cfg.blur_kernel or kernel_size_for(cfg.image_size)
    one_view = T.Compose(
        [
            T.RandomResizedCrop(cfg.image_size, scale=cfg.crop_scale, ratio=cfg.crop_ratio, antialias=True),
            T.RandomHorizontalFlip(cfg.hflip_p),
            T.RandomApply([T.ColorJitter(cfg.brightness, cfg.contrast, cfg.saturation, cfg.hue)], p=cfg.jitter_p),
            T.RandomGrayscale(cfg.grayscale_p),
            T.RandomApply([T.GaussianBlur(kernel, cfg.blur_sigma)], p=cfg.blur_p),
            T.ToDtype(torch.float32, scale=True),
            T.Normalize(MEAN, STD),
        ]
    )

    def run(images: torch.Tensor):
        views = [(one_view(image), one_view(image)) for image in images]
        return torch.stack([v for v, _ in views]), torch.stack([v for _, v in views])

    return run


def kornia_sequential(cfg: AugmentConfig, device: torch.device):
    """Default kornia modules in an nn.Sequential, called once per view."""
    kernel = cfg.blur_kernel or kernel_size_for(cfg.image_size)
    one_view = nn.Sequential(
        K.RandomResizedCrop((cfg.image_size, cfg.image_size), scale=cfg.crop_scale, ratio=cfg.crop_ratio),
        K.RandomHorizontalFlip(p=cfg.hflip_p),
        K.ColorJitter(cfg.brightness, cfg.contrast, cfg.saturation, cfg.hue, p=cfg.jitter_p),
        K.RandomGrayscale(p=cfg.grayscale_p),
        K.RandomGaussianBlur(kernel, cfg.blur_sigma, p=cfg.blur_p),
        K.Normalize(torch.tensor(MEAN), torch.tensor(STD)),
    ).to(device)

    @torch.no_grad()
    def run(images: torch.Tensor):
        return one_view(images.float() / 255), one_view(images.float() / 255)

    return run


def synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def measure(pipelines: dict, inputs: dict, repeats: int, device: torch.device) -> dict[str, dict[str, list[float]]]:
    """Wall and CPU seconds per call of every pipeline, round-robin over ``repeats`` after one warm-up each."""
    for name, run in pipelines.items():
        run(inputs[name])
    seconds = {name: {"wall": [], "cpu": []} for name in pipelines}
    for _ in range(repeats):
        for name, run in pipelines.items():
            synchronize(device)
            wall, cpu = time.perf_counter(), time.process_time()
            run(inputs[name])
            synchronize(device)
            seconds[name]["cpu"].append(time.process_time() - cpu)
            seconds[name]["wall"].append(time.perf_counter() - wall)
    return seconds


def per_view(cpu: dict[str, float], batch: int, local_views: int, pixel_ratio: float) -> dict[str, float]:
    """CPU microseconds per view of the two-view and multi-crop calls, and of a local view alone.

    ``pixel_ratio`` is a local view's pixels over a global view's: a local view as cheap per pixel as
    a global one costs ``pixel_ratio`` of it.
    """
    global_us = cpu["sslkit"] / (2 * batch) * 1e6
    local_us = (cpu["sslkit-multicrop"] - cpu["sslkit"]) / (local_views * batch) * 1e6
    return {
        "two_view_us": global_us,
        "multicrop_us": cpu["sslkit-multicrop"] / ((2 + local_views) * batch) * 1e6,
        "local_us": local_us,
        "local_over_global": local_us / global_us,
        "local_per_pixel_over_global": local_us / global_us / pixel_ratio,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/bench/augment.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256, help="source images per call (each gives two views)")
    parser.add_argument("--size", type=int, default=32, help="input and output side (CIFAR-10: 32)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help=f"torch CPU threads (default 1: per-core throughput; this machine has {os.cpu_count()} cores)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="device for sslkit and kornia (torchvision per-image stays on the CPU, as in a DataLoader worker)",
    )
    parser.add_argument("--local-views", type=int, default=6, help="local views of sslkit-multicrop (DINO: 6-10)")
    parser.add_argument("--local-size", type=int, help="their side (default: half of --size; DINO: 96 for 224)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    cfg = AugmentConfig(image_size=args.size)
    images = torch.randint(0, 256, (args.batch, 3, args.size, args.size), dtype=torch.uint8)
    local_size = args.local_size or args.size // 2
    multi = AugmentConfig(
        image_size=args.size, local_views=args.local_views, local_size=local_size, local_crop_scale=(0.05, 0.4)
    )
    pipelines = {
        "sslkit": TwoViewAugment(cfg, 3, MEAN, STD).to(device),
        "sslkit-multicrop": TwoViewAugment(multi, 3, MEAN, STD).to(device),
        "torchvision-per-image": torchvision_per_image(cfg),
        "kornia-sequential": kornia_sequential(cfg, device),
    }
    inputs = {name: images if name == "torchvision-per-image" else images.to(device) for name in pipelines}
    seconds = measure(pipelines, inputs, args.repeats, device)

    wall = {name: statistics.median(values["wall"]) for name, values in seconds.items()}
    cpu = {name: statistics.median(values["cpu"]) for name, values in seconds.items()}
    result = {
        "batch": args.batch,
        "size": args.size,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "device": str(device),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__, "kornia": kornia.__version__},
        "pipelines": {
            name: {
                "median_wall_s": wall[name],
                "median_cpu_s": cpu[name],
                "images_per_s": args.batch / wall[name],
                "sslkit_speedup_wall": wall[name] / wall["sslkit"],
                "sslkit_speedup_cpu": cpu[name] / cpu["sslkit"],
                "all_wall_s": seconds[name]["wall"],
                "all_cpu_s": seconds[name]["cpu"],
            }
            for name in pipelines
        },
        "per_view": per_view(cpu, args.batch, args.local_views, (local_size / args.size) ** 2),
        "local_views": args.local_views,
        "local_size": local_size,
    }

    table = Table(
        title=f"two views of {args.batch} uint8 images {args.size}x{args.size}, {device}, "
        f"{result['threads']} thread(s), median of {args.repeats}"
    )
    table.add_column("pipeline", no_wrap=True)
    for column in ("wall ms", "CPU ms", "images/s", "sslkit x (wall)", "sslkit x (CPU)"):
        table.add_column(column, justify="right")
    for name, row in result["pipelines"].items():
        table.add_row(
            name,
            f"{row['median_wall_s'] * 1e3:.1f}",
            f"{row['median_cpu_s'] * 1e3:.1f}",
            f"{row['images_per_s']:.0f}",
            f"{row['sslkit_speedup_wall']:.2f}",
            f"{row['sslkit_speedup_cpu']:.2f}",
        )
    console = Console(width=max(100, Console().width))
    console.print(table)
    cost = result["per_view"]
    console.print(
        f"CPU per view: two-view path {cost['two_view_us']:.0f} us; multi-crop (2 x {args.size} px + "
        f"{args.local_views} x {local_size} px) {cost['multicrop_us']:.0f} us a view, a local view "
        f"{cost['local_us']:.0f} us = {cost['local_over_global']:.2f}x a global one "
        f"({cost['local_per_pixel_over_global']:.2f}x per pixel)"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
        console.print(f"figures written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
