"""Training throughput of sslkit's loop pieces on Fashion-MNIST: full steps against the compute floor.

    python tools/bench/train.py [--recipe recipes/fashion_mnist_simclr.yaml] [--steps N] [--quick] [--out JSON]

Two kinds of step over the same method and optimizer, built by the builders ``sslkit.loop.train``
itself calls (``make_accelerator``, ``make_train_loader``, ``make_method``, ``make_optimizer``,
``prepare_for_training``), so the benchmark follows the loop when the loop changes:

- ``full``: what one iteration of the training loop does. ``next()`` on the prepared loader (the
  time blocked there is the *data wait*), both views augmented on the device (or, with
  ``data.augment_in_workers`` resolved to true, made by the loader workers), forward, backward, the
  scheduled learning rate and the optimizer step.
- ``floor``: the same forward + backward + optimizer step on one pre-augmented batch, again
  and again: no loader and no augmentation. ``1 - floor / full`` is the share of the step that
  data and augmentation cost.

Threads default to 1 (``--threads``): per-core figures, steady where other jobs share the cores
(two threads on two busy cores measured 5-20x slower per step). After a few warm-up steps
(oneDNN builds its kernels on the first calls) the two kinds of step alternate, so that load
drift on a shared machine hits both alike; with loader workers they run in two blocks instead,
since workers would prefetch during floor steps and hide the wait (see :func:`measure`). Per
step the table gives medians of wall time split into data wait, augmentation and compute, and
the largest data wait, which answers "does the step ever wait on data". Images/s is images per
wall second summed over the steps of a kind, as the loop's ``metrics.jsonl`` counts it; CPU
seconds (this process, all threads) are recorded too, the steadier figure where other jobs share
the cores.

The recipe defaults to ``recipes/fashion_mnist_simclr.yaml``; while that file does not exist,
``recipes/quickstart.yaml`` with ``data.name=fashion_mnist augment.image_size=28``. Without the
Fashion-MNIST files the benchmark falls back to scikit-learn's digits and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __name__ == "__main__" and __package__ in (None, ""):
    # Run as a script: the repository root first on the path. Not when a test imports this file
    # as a module, where sys.path[0] is the test process's own entry.
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.utils import set_seed  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from sslkit import datasets, models  # noqa: E402
from sslkit.augment import TwoViewAugment  # noqa: E402
from sslkit.config import Config, load_config  # noqa: E402
from sslkit.datasets import EpochShuffleSampler, augmented, build_splits  # noqa: E402
from sslkit.datasets.batches import AugmentedViews  # noqa: E402
from sslkit.datasets.idx import FASHION_MNIST_ROOT  # noqa: E402
from sslkit.loop import build  # noqa: E402
from sslkit.loop.state import Schedule  # noqa: E402
from sslkit.loop.step import FiniteLoss, TrainingStep  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FASHION_RECIPE = ROOT / "recipes" / "fashion_mnist_simclr.yaml"
QUICKSTART = ROOT / "recipes" / "quickstart.yaml"
QUICKSTART_FASHION = ["data.name=fashion_mnist", "augment.image_size=28"]
# --quick: a smoke run (seconds); its figures mean little beyond "it runs".
QUICK_OVERRIDES = ["train.batch_size=32", "model.width=8"]
FULL_STEPS, QUICK_STEPS = 40, 4
FULL_WARMUP, QUICK_WARMUP = 3, 1


def default_recipe() -> tuple[Path, list[str]]:
    """The Fashion-MNIST SimCLR recipe, or the quick start pointed at Fashion-MNIST while it is missing."""
    if FASHION_RECIPE.is_file():
        return FASHION_RECIPE, []
    return QUICKSTART, list(QUICKSTART_FASHION)


def fashion_mnist_available(cfg: Config) -> bool:
    try:
        datasets.build_dataset("fashion_mnist", "test", cfg.data.root)
    except Exception:  # a UserError naming the missing files; the caller reports the fallback
        return False
    return True


def resolve_config(
    recipe: Path | None, overrides: list[str], quick: bool, threads: int | None = 1
) -> tuple[Config, Path, list[str], str | None]:
    """The config to measure, the recipe and overrides it came from, and a note when it fell back to digits."""
    implied: list[str] = []
    if recipe is None:
        recipe, implied = default_recipe()
    implied += [f"train.threads={threads}"] if threads else []
    overrides = implied + (QUICK_OVERRIDES if quick else []) + list(overrides)
    cfg = load_config(recipe, overrides)
    note = None
    if cfg.data.name == "fashion_mnist" and not fashion_mnist_available(cfg):
        note = (
            f"Fashion-MNIST files not found in {cfg.data.root or FASHION_MNIST_ROOT}: "
            f"measured on scikit-learn's digits (8x8) instead"
        )
        # Digits are 8x8: the quick start's 16x16 crop, not Fashion-MNIST's 28.
        overrides = [o for o in overrides if o not in QUICKSTART_FASHION and not o.startswith("data.root=")]
        overrides += ["data.name=digits", "augment.image_size=16"]
        cfg = load_config(recipe, overrides)
    return cfg, recipe, overrides, note


# --------------------------------------------------------------------------- the pieces


@dataclass
class Pieces:
    """What one training step touches, prepared by the accelerator as ``sslkit.loop.train`` prepares it."""

    accelerator: Accelerator
    loader: DataLoader
    sampler: EpochShuffleSampler
    augment: TwoViewAugment
    step: TrainingStep  # the prepared method and optimizer
    schedule: Schedule
    cfg: Config
    dataset_size: int


def build_pieces(cfg: Config, total_steps: int) -> Pieces:
    """Accelerator, loader, augmentation, method and optimizer, built by ``sslkit.loop``'s own builders.

    The same calls ``train()`` makes, in its order. Left out: the run directory, trackers,
    checkpoints, ``run.init_from`` and the evaluation loaders, none of which a training step touches.
    """
    accelerator = build.make_accelerator(cfg)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    set_seed(cfg.run.seed, device_specific=True)

    splits = build_splits(cfg)
    info = splits.info
    augment = build.make_augment(cfg, info)  # the loop's views: FixMatch's second one is the strong view
    in_workers = augmented.in_workers(cfg.data.augment_in_workers, accelerator.device, cfg.data.num_workers)
    local_batch = cfg.train.batch_size // accelerator.num_processes
    loader, sampler = build.make_train_loader(cfg, splits.train, local_batch, augment if in_workers else None)
    augment = augment if in_workers else augment.to(accelerator.device)
    backbone = models.backbone_from_config(cfg.model, augment.out_channels)
    method = build.make_method(cfg, backbone, info.num_classes, len(splits.train), accelerator.device.type)
    optimizer, lr = build.make_optimizer(cfg, method)
    method, optimizer, loader = build.prepare_for_training(cfg, accelerator, method, optimizer, loader)
    schedule = Schedule.from_config(cfg, len(loader), lr, total_steps)
    method.train()
    step = TrainingStep(accelerator, method, optimizer, FiniteLoss(accelerator))
    return Pieces(accelerator, loader, sampler, augment, step, schedule, cfg, len(splits.train))


def optimizer_step(
    pieces: Pieces, view1: torch.Tensor, view2: torch.Tensor, labels: torch.Tensor, step: int, *indices: torch.Tensor
) -> float:
    """Forward, check, backward and optimizer step on augmented views: the loop's own step; returns the loss.

    ``indices``: each sample's position in the training set, for methods that keep per-sample state (NPID).
    """
    p, lr = pieces, pieces.schedule.lr(step, pieces.cfg)
    return p.step((view1, view2), labels, indices, lr).loss.item()


def views_of(pieces: Pieces, images) -> tuple[torch.Tensor, ...]:
    """The views of a batch, as the loop makes them: already made by the loader workers
    (``data.augment_in_workers``), or augmented here."""
    return images.views if isinstance(images, AugmentedViews) else pieces.augment(images)


def _synchronize(device: torch.device) -> None:
    # Device work is asynchronous: a phase boundary is only a boundary once the device caught up.
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


class EndlessBatches:
    """Batches of the prepared loader across epoch ends, with the sampler's epoch set as the loop sets it."""

    def __init__(self, pieces: Pieces) -> None:
        self.pieces, self.epoch, self.iterator = pieces, 0, None

    def next(self) -> tuple[torch.Tensor, ...]:
        """``(images, labels)``, plus ``indices`` for methods that need them (as the loop unpacks them)."""
        while True:
            if self.iterator is None:
                self.pieces.loader.set_epoch(self.epoch)
                self.pieces.sampler.set_epoch(self.epoch)
                self.iterator = iter(self.pieces.loader)
            try:
                return next(self.iterator)
            except StopIteration:
                self.iterator, self.epoch = None, self.epoch + 1


def time_full_steps(
    pieces: Pieces, batches: EndlessBatches, steps: int, first_step: int = 0
) -> list[dict[str, float]]:
    """Per-step wall seconds of data wait, augmentation and compute, and CPU seconds of the whole step."""
    device = pieces.accelerator.device
    records = []
    for step in range(first_step, first_step + steps):
        start, cpu = time.perf_counter(), time.process_time()
        images, labels, *indices = batches.next()
        fetched = time.perf_counter()
        with torch.no_grad():
            view1, view2 = views_of(pieces, images)
        _synchronize(device)
        augmented = time.perf_counter()
        loss = optimizer_step(pieces, view1, view2, labels, step, *indices)
        _synchronize(device)
        end = time.perf_counter()
        records.append(
            {
                "data_wait": fetched - start,
                "augment": augmented - fetched,
                "compute": end - augmented,
                "total": end - start,
                "cpu": time.process_time() - cpu,
                "loss": loss,
                "images": len(labels) * pieces.accelerator.num_processes,  # FixMatch: labelled and unlabelled
            }
        )
    return records


def time_floor_steps(
    pieces: Pieces, views: tuple[torch.Tensor, ...], steps: int, first_step: int = 0
) -> list[dict[str, float]]:
    """Per-step wall and CPU seconds of forward + backward + optimizer step on one fixed augmented batch."""
    device = pieces.accelerator.device
    records = []
    for step in range(first_step, first_step + steps):
        start, cpu = time.perf_counter(), time.process_time()
        view1, view2, labels, *indices = views
        loss = optimizer_step(pieces, view1, view2, labels, step, *indices)
        _synchronize(device)
        total, images = time.perf_counter() - start, len(labels) * pieces.accelerator.num_processes
        records.append({"total": total, "cpu": time.process_time() - cpu, "loss": loss, "images": images})
    return records


def measure(pieces: Pieces, steps: int, warmup: int, num_workers: int) -> tuple[list[dict], list[dict], str]:
    """Warm-up steps of both kinds, then ``steps`` timed full steps and floor steps, and how they were ordered.

    Without loader workers the two kinds alternate step by step ("interleaved"): load on a shared
    machine drifts over seconds, and alternating makes both see the same drift, while nothing is
    prefetched during a floor step, so the data wait stays what the loop sees. With workers they
    would prefetch during the floor steps and hide the wait, so the kinds run in two blocks ("phases").
    """
    batches = EndlessBatches(pieces)
    time_full_steps(pieces, batches, warmup)
    images, labels, *indices = batches.next()  # the floor's batch: one the loop would have seen
    with torch.no_grad():
        views = (*views_of(pieces, images), labels, *indices)
    time_floor_steps(pieces, views, warmup, first_step=warmup)
    step = 2 * warmup
    if num_workers > 0:
        full = time_full_steps(pieces, batches, steps, first_step=step)
        return full, time_floor_steps(pieces, views, steps, first_step=step + steps), "phases"
    full, floor = [], []
    for _ in range(steps):
        full += time_full_steps(pieces, batches, 1, first_step=step)
        floor += time_floor_steps(pieces, views, 1, first_step=step + 1)
        step += 2
    return full, floor, "interleaved"


# --------------------------------------------------------------------------- summary


def _median(records: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in records)


def summarize(full: list[dict], floor: list[dict]) -> dict:
    """Headline figures of the two phases (see the module docstring for their meaning); images/s counts every
    image a step loaded (a FixMatch step: its labelled and its unlabelled images)."""
    full_total = sum(r["total"] for r in full)
    floor_total = sum(r["total"] for r in floor)
    waits = [r["data_wait"] for r in full]
    median_full, median_floor = _median(full, "total"), _median(floor, "total")
    full_speed = sum(r["images"] for r in full) / full_total
    floor_speed = sum(r["images"] for r in floor) / floor_total
    return {
        "full": {
            "images_per_s": full_speed,
            "median_step_s": median_full,
            "median_cpu_s": _median(full, "cpu"),
            "median_s": {key: _median(full, key) for key in ("data_wait", "augment", "compute")},
            "share": {key: sum(r[key] for r in full) / full_total for key in ("data_wait", "augment", "compute")},
        },
        "floor": {
            "images_per_s": floor_speed,
            "median_step_s": median_floor,
            "median_cpu_s": _median(floor, "cpu"),
        },
        "data_wait": {
            "share": sum(waits) / full_total,
            "median_s": statistics.median(waits),
            "max_s": max(waits),
            "max_over_median_step": max(waits) / median_full,
        },
        # What the data and the augmentation add on top of the compute floor, as a share of the full step;
        # and the same read off the full step's own clock (data wait + augmentation over step time).
        "data_and_augment_share": max(0.0, 1.0 - median_floor / median_full),
        "data_and_augment_share_in_step": sum(r["data_wait"] + r["augment"] for r in full) / full_total,
        "data_and_augment_share_cpu": max(0.0, 1.0 - _median(floor, "cpu") / _median(full, "cpu")),
        "floor_over_full_images_per_s": floor_speed / full_speed,
    }


def render(result: dict, console: Console) -> None:
    s, cfg = result["summary"], result["config"]
    title = (
        f"training step, {result['dataset']} {cfg['image_size']}x{cfg['image_size']}, batch {cfg['batch_size']}, "
        f"{cfg['backbone']} width {cfg['width']}, {result['threads']} thread(s), {cfg['num_workers']} loader worker(s)"
    )
    table = Table(
        title=title,
        caption=f"medians over {result['steps']} steps of each kind ({result['schedule']}) after "
        f"{result['warmup_steps']} warm-up",
    )
    for column in ("phase", "images/s", "step ms", "CPU ms", "data wait ms", "augment ms", "compute ms"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    full, floor = s["full"], s["floor"]
    table.add_row(
        "full step (loader + augment + fwd/bwd/step)",
        f"{full['images_per_s']:.0f}",
        f"{full['median_step_s'] * 1e3:.1f}",
        f"{full['median_cpu_s'] * 1e3:.1f}",
        f"{full['median_s']['data_wait'] * 1e3:.2f}",
        f"{full['median_s']['augment'] * 1e3:.1f}",
        f"{full['median_s']['compute'] * 1e3:.1f}",
    )
    table.add_row(
        "floor (fixed augmented batch, fwd/bwd/step)",
        f"{floor['images_per_s']:.0f}",
        f"{floor['median_step_s'] * 1e3:.1f}",
        f"{floor['median_cpu_s'] * 1e3:.1f}",
        "-",
        "-",
        f"{floor['median_step_s'] * 1e3:.1f}",
    )
    console.print(table)
    wait = s["data_wait"]
    console.print(
        f"data + augmentation against the floor: {100 * s['data_and_augment_share']:.1f}% of the step (wall medians), "
        f"{100 * s['data_and_augment_share_cpu']:.1f}% (CPU medians); timed inside the full step: "
        f"{100 * s['data_and_augment_share_in_step']:.1f}% (augmentation {100 * full['share']['augment']:.1f}%)"
    )
    console.print(
        f"data wait: {100 * wait['share']:.2f}% of step time; per step median {wait['median_s'] * 1e3:.2f} ms, "
        f"max {wait['max_s'] * 1e3:.2f} ms ({100 * wait['max_over_median_step']:.1f}% of a median step)"
    )
    if result.get("note"):
        console.print(f"[yellow]note:[/] {result['note']}")
    console.print(
        f"load average (1 min) before/after: {result['load_average'][0]:.1f} / {result['load_average'][1]:.1f} "
        f"on {result['cores']} cores"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/bench/train.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--recipe",
        type=Path,
        help=f"YAML recipe (default {FASHION_RECIPE.relative_to(ROOT)}, "
        f"else {QUICKSTART.relative_to(ROOT)} with {' '.join(QUICKSTART_FASHION)})",
    )
    parser.add_argument(
        "overrides", nargs="*", help="dotted key=value overrides of the recipe, e.g. data.num_workers=2"
    )
    parser.add_argument(
        "--steps", type=int, help=f"timed steps per phase (default {FULL_STEPS}, --quick {QUICK_STEPS})"
    )
    parser.add_argument(
        "--warmup", type=int, help=f"untimed steps before each phase (default {FULL_WARMUP}, --quick {QUICK_WARMUP})"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch.set_num_threads (train.threads; default 1: per-core figures that stay steady on a shared "
        "machine, where two threads on two busy cores measured 5-20x slower; 0: the recipe's own)",
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"a smoke run: {' '.join(QUICK_OVERRIDES)}, {QUICK_STEPS} steps"
    )
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)

    from sslkit.console import print_user_error
    from sslkit.errors import UserError

    steps = args.steps or (QUICK_STEPS if args.quick else FULL_STEPS)
    warmup = args.warmup if args.warmup is not None else (QUICK_WARMUP if args.quick else FULL_WARMUP)
    load_before = os.getloadavg()[0]
    try:
        cfg, recipe, overrides, note = resolve_config(args.recipe, args.overrides, args.quick, args.threads)
        pieces = build_pieces(cfg, total_steps=2 * (warmup + steps))
    except UserError as error:
        print_user_error(error)
        return 2
    full, floor, schedule = measure(pieces, steps, warmup, cfg.data.num_workers)

    result = {
        "dataset": cfg.data.name,
        "note": note,
        "recipe": str(recipe.resolve().relative_to(ROOT) if recipe.resolve().is_relative_to(ROOT) else recipe),
        "overrides": overrides,
        "quick": args.quick,
        "steps": steps,
        "warmup_steps": warmup,
        "schedule": schedule,
        "config": {
            "batch_size": cfg.train.batch_size,
            "image_size": cfg.augment.image_size,
            "backbone": cfg.model.backbone,
            "width": cfg.model.width,
            "method": cfg.method.name,
            "loss": cfg.loss.name,
            "optimizer": cfg.optim.name,
            "num_workers": cfg.data.num_workers,
            "mixed_precision": cfg.train.mixed_precision,
            "channels_last": cfg.model.channels_last,
        },
        "device": str(pieces.accelerator.device),
        "threads": torch.get_num_threads(),
        "cores": os.cpu_count(),
        "load_average": [load_before, os.getloadavg()[0]],
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "summary": summarize(full, floor),
        "per_step": {"full": full, "floor": floor},
    }
    console = Console(width=max(120, Console().width))
    render(result, console)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
        console.print(f"figures written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
