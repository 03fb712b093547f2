"""Images/s from a folder of JPEGs to two augmented 224 px views: sslkit's two paths against torchvision's ImageFolder.

    python tools/bench/folders.py [--images 3000] [--batch 64] [--workers 2] [--batches 30] [--out bench.json]

The benchmark first writes its own folder (``--folder``, default ``runs/bench/folder-jpegs``;
kept and reused): ``--images`` JPEGs of random smooth content, each side drawn from 200-600 px
independently, so sizes and aspect ratios vary. Two pipelines then read it, each in a
DataLoader with ``--workers`` worker processes and batches of ``--batch`` images:

- ``sslkit, workers augment``: :func:`sslkit.datasets.folders.image_folder` with the loader
  :func:`sslkit.loop.build.make_train_loader` builds with ``data.augment_in_workers`` on (the CPU
  path, ``auto`` on a CPU device): each worker decodes a batch of JPEGs at their own sizes into a
  padded batch and :class:`sslkit.augment.TwoViewAugment` (the SimCLR set at 224 px) augments it
  there; the training process only receives the views.
- ``sslkit, process augments``: the same loader with ``data.augment_in_workers`` off (the
  accelerator path, ``auto`` on a GPU): the workers only decode, and the training process
  augments each whole batch, on the CPU here.
- ``torchvision``: ``torchvision.datasets.ImageFolder`` (PIL decoding) with
  ``torchvision.transforms.v2`` applied per image in the workers: ``ToImage``, then the same
  SimCLR set (RandomResizedCrop 224, flip, colour jitter, grayscale, blur, normalise) twice, and
  the default collate.

Each pipeline runs ``--rounds`` times, alternating, after a warm-up of two batches per epoch
(worker start-up is excluded); images/s counts source images, each turned into two views, per
wall-clock second; the table gives the median round. CPU ms / image is the CPU time of the
training process and its loader workers over the timed batches (the steadier figure on a
machine shared with other jobs). Every file is read once before timing, so both pipelines read
from the page cache. ``--threads`` is the torch thread count of
the training process (default 1, as the other benchmarks; each worker uses one), so every
pipeline has the same workers and the same threads in total.
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
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import numpy as np  # noqa: E402
import psutil  # noqa: E402  (a dependency of accelerate)
import torch  # noqa: E402
import torchvision  # noqa: E402
from PIL import Image  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from torchvision.transforms import v2 as T  # noqa: E402

from sslkit.augment import TwoViewAugment, kernel_size_for  # noqa: E402
from sslkit.config import Config  # noqa: E402
from sslkit.datasets import folders  # noqa: E402
from sslkit.datasets.base import IMAGENET_MEAN, IMAGENET_STD  # noqa: E402
from sslkit.loop.build import make_train_loader  # noqa: E402


def write_folder(folder: Path, count: int, seed: int = 0) -> None:
    """``count`` JPEGs (quality 90) of 200-600 px on each side in ``folder/all/`` (ImageFolder needs a class)."""
    target = folder / "all"
    target.mkdir(parents=True, exist_ok=True)
    have = len(list(target.glob("*.jpg")))
    rng = np.random.default_rng(seed)
    for i in range(count):
        height, width = (int(v) for v in rng.integers(200, 601, size=2))
        if i < have:
            continue
        # Smooth content (a low-resolution noise image enlarged) compresses like a photo, unlike pixel noise.
        small = rng.integers(0, 256, size=(height // 16 + 1, width // 16 + 1, 3), dtype=np.uint8)
        Image.fromarray(small).resize((width, height), Image.BILINEAR).save(target / f"{i:05d}.jpg", quality=90)


def torchvision_loader(folder: Path, batch: int, workers: int) -> torch.utils.data.DataLoader:
    """ImageFolder + v2 transforms: the usual peer set-up, two views per image made in the workers."""
    kernel = kernel_size_for(224)
    cfg = Config().augment
    one_view = T.Compose(
        [
            T.RandomResizedCrop(224, scale=cfg.crop_scale, ratio=cfg.crop_ratio, antialias=True),
            T.RandomHorizontalFlip(cfg.hflip_p),
            T.RandomApply([T.ColorJitter(cfg.brightness, cfg.contrast, cfg.saturation, cfg.hue)], p=cfg.jitter_p),
            T.RandomGrayscale(cfg.grayscale_p),
            T.RandomApply([T.GaussianBlur(kernel, cfg.blur_sigma)], p=cfg.blur_p),
            T.ToDtype(torch.float32, scale=True),
            T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
    to_image = T.ToImage()

    def two_views(image):
        image = to_image(image)
        return one_view(image), one_view(image)

    dataset = torchvision.datasets.ImageFolder(str(folder), transform=two_views)
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch, shuffle=True, drop_last=True, num_workers=workers, persistent_workers=False
    )


def sslkit_pipeline(folder: Path, batch: int, workers: int, in_workers: bool):
    """sslkit's loader as training builds it, and the batch augmentation at 224 px (in the workers or not)."""
    cfg = Config()
    cfg.data.name, cfg.data.root, cfg.data.num_workers = "imagefolder", str(folder), workers
    cfg.data.augment_in_workers = in_workers
    cfg.augment.image_size = 224
    dataset = folders.image_folder("train", str(folder))
    augment = TwoViewAugment(cfg.augment, 3, IMAGENET_MEAN, IMAGENET_STD)
    loader, _ = make_train_loader(cfg, dataset, batch, augment if in_workers else None)
    return loader, augment


def cpu_seconds() -> tuple[float, float]:
    """CPU time of this process, and of its live children (the loader workers)."""
    me = psutil.Process()
    return sum(me.cpu_times()[:2]), sum(sum(p.cpu_times()[:2]) for p in me.children(recursive=True))


def time_batches(batches, count: int, step=None) -> tuple[float, float, float]:
    """Wall seconds, and CPU seconds of this process and of its workers, for ``count`` batches after two
    warm-up ones."""
    iterator = iter(batches)
    for _ in range(2):
        item = next(iterator)
        if step:
            step(item)
    start, (own, workers) = time.perf_counter(), cpu_seconds()
    for _ in range(count):
        item = next(iterator)
        if step:
            step(item)
    wall, (own_end, workers_end) = time.perf_counter() - start, cpu_seconds()
    return wall, own_end - own, workers_end - workers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/bench/folders.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=Path("runs/bench/folder-jpegs"))
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=30, help="timed batches per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="smoke run: 300 images, 3 batches of 16, 1 round")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.batch, args.batches, args.rounds = 300, 16, 3, 1
    if args.images < (args.batches + 2) * args.batch:
        parser.error(f"--images {args.images} is fewer than (--batches + 2) x --batch")

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    write_folder(args.folder, args.images)
    in_workers, _ = sslkit_pipeline(args.folder, args.batch, args.workers, in_workers=True)
    in_process, augment = sslkit_pipeline(args.folder, args.batch, args.workers, in_workers=False)
    pipelines = {
        "sslkit, workers augment": (in_workers, None),
        "sslkit, process augments": (in_process, lambda batch: augment(batch[0])),
        "torchvision": (torchvision_loader(args.folder, args.batch, args.workers), None),
    }
    for path in sorted(args.folder.rglob("*.jpg")):  # every pipeline reads from the page cache, not the disk
        path.read_bytes()
    seconds: dict[str, list[float]] = {name: [] for name in pipelines}
    cpu: dict[str, list[float]] = {name: [] for name in pipelines}
    cpu_process: dict[str, list[float]] = {name: [] for name in pipelines}
    for _ in range(args.rounds):
        for name, (loader, step) in pipelines.items():
            wall, own, workers = time_batches(loader, args.batches, step)
            seconds[name].append(wall)
            cpu[name].append(own + workers)
            cpu_process[name].append(own)
    images = args.batches * args.batch
    rate = {name: images / statistics.median(values) for name, values in seconds.items()}
    cpu_ms = {name: 1e3 * statistics.median(values) / images for name, values in cpu.items()}
    process_ms = {name: 1e3 * statistics.median(values) / images for name, values in cpu_process.items()}
    peer = "torchvision"
    result = {
        "images": args.images,
        "batch": args.batch,
        "workers": args.workers,
        "batches": args.batches,
        "rounds": args.rounds,
        "threads": args.threads,
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__},
        "images_per_s": rate,
        "x_torchvision_wall": {name: rate[name] / rate[peer] for name in rate},
        "cpu_ms_per_image": cpu_ms,
        "training_process_cpu_ms_per_image": process_ms,
        "x_torchvision_cpu": {name: cpu_ms[peer] / cpu_ms[name] for name in cpu_ms},
        "all_seconds": seconds,
        "all_cpu_seconds": cpu,
    }
    table = Table(
        title=f"{args.images} JPEGs 200-600 px -> two 224 px views, batch {args.batch}, {args.workers} workers, "
        f"{args.threads} thread{'s' if args.threads > 1 else ''} in the training process, median of {args.rounds}"
    )
    columns = ("pipeline", "images/s", "x torchvision (wall)", "CPU ms / image", "of which training process")
    for column in (*columns, "x torchvision (CPU)"):
        table.add_column(column, justify="right")
    for name in seconds:
        table.add_row(
            name,
            f"{rate[name]:.1f}",
            f"{rate[name] / rate[peer]:.2f}",
            f"{cpu_ms[name]:.1f}",
            f"{process_ms[name]:.1f}",
            f"{cpu_ms[peer] / cpu_ms[name]:.2f}",
        )
    console = Console(width=max(100, Console().width))
    console.print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
        console.print(f"figures written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
