"""Images/s from a folder of JPEGs to two augmented 224 px views: sslkit against torchvision's ImageFolder.

    python tools/bench/folders.py [--images 3000] [--batch 64] [--workers 2] [--batches 30] [--out bench.json]

The benchmark first writes its own folder (``--folder``, default ``runs/bench/folder-jpegs``;
kept and reused): ``--images`` JPEGs of random smooth content, each side drawn from 200-600 px
independently, so sizes and aspect ratios vary. Two pipelines then read it, each in a
DataLoader with ``--workers`` worker processes and batches of ``--batch`` images:

- ``sslkit``: :func:`sslkit.datasets.folders.image_folder` with the loader :func:`sslkit.loop.build.make_train_loader`
  builds; the workers decode each JPEG at its own size into a padded batch, and
  :class:`sslkit.augment.TwoViewAugment` (the SimCLR set at 224 px) augments the whole batch in the
  training process, as in training.
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
the training process (default 1, as the other benchmarks; each worker uses one).
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


def sslkit_pipeline(folder: Path, batch: int, workers: int):
    """sslkit's loader as training builds it, and the batch augmentation at 224 px."""
    cfg = Config()
    cfg.data.name, cfg.data.root, cfg.data.num_workers = "imagefolder", str(folder), workers
    cfg.augment.image_size = 224
    dataset = folders.image_folder("train", str(folder))
    loader, _ = make_train_loader(cfg, dataset, batch)
    augment = TwoViewAugment(cfg.augment, 3, IMAGENET_MEAN, IMAGENET_STD)
    return loader, augment


def cpu_seconds() -> float:
    """CPU time of this process and its live children (the loader workers)."""
    me = psutil.Process()
    return sum(sum(p.cpu_times()[:2]) for p in [me, *me.children(recursive=True)])


def time_batches(batches, count: int, step=None) -> tuple[float, float]:
    """Wall and CPU seconds (this process and its workers) for ``count`` batches after two warm-up ones."""
    iterator = iter(batches)
    for _ in range(2):
        item = next(iterator)
        if step:
            step(item)
    start, cpu = time.perf_counter(), cpu_seconds()
    for _ in range(count):
        item = next(iterator)
        if step:
            step(item)
    return time.perf_counter() - start, cpu_seconds() - cpu


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
    ours, augment = sslkit_pipeline(args.folder, args.batch, args.workers)
    peer = torchvision_loader(args.folder, args.batch, args.workers)
    for path in sorted(args.folder.rglob("*.jpg")):  # both read from the page cache, not the disk
        path.read_bytes()
    seconds: dict[str, list[float]] = {"sslkit": [], "torchvision": []}
    cpu: dict[str, list[float]] = {"sslkit": [], "torchvision": []}
    for _ in range(args.rounds):
        for name, loader, step in (("sslkit", ours, lambda batch: augment(batch[0])), ("torchvision", peer, None)):
            wall, used = time_batches(loader, args.batches, step)
            seconds[name].append(wall)
            cpu[name].append(used)
    images = args.batches * args.batch
    rate = {name: images / statistics.median(values) for name, values in seconds.items()}
    cpu_ms = {name: 1e3 * statistics.median(values) / images for name, values in cpu.items()}
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
        "sslkit_speedup": rate["sslkit"] / rate["torchvision"],
        "cpu_ms_per_image": cpu_ms,
        "sslkit_cpu_saving": cpu_ms["torchvision"] / cpu_ms["sslkit"],
        "all_seconds": seconds,
        "all_cpu_seconds": cpu,
    }
    table = Table(
        title=f"{args.images} JPEGs 200-600 px -> two 224 px views, batch {args.batch}, {args.workers} workers, "
        f"median of {args.rounds}"
    )
    for column in ("pipeline", "images/s", "sslkit x (wall)", "CPU ms / image", "sslkit x (CPU)"):
        table.add_column(column, justify="right")
    for name in seconds:
        table.add_row(
            name,
            f"{rate[name]:.1f}",
            f"{rate['sslkit'] / rate[name]:.2f}",
            f"{cpu_ms[name]:.1f}",
            f"{cpu_ms[name] / cpu_ms['sslkit']:.2f}",
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
