"""Images/s and model FLOPs utilisation (MFU) of SimCLR training steps on a GPU: ResNet-18 with the CIFAR stem at
32 px and ViT-S/16 at 224 px, bf16 autocast, channels_last, the loop's own optimizer step.

    python tools/bench/gpu_step.py [--models resnet18-cifar vit-s16] [--batch 256] [--steps 30] [--out JSON]
    python tools/bench/gpu_step.py --quick        # a smoke run on any device (tiny models, 2 steps)

Each model is built from the quick start recipe with the overrides in :data:`MODELS` (sslkit's method,
optimizer and step: ``sslkit.loop.build.make_method``, ``make_optimizer``,
``sslkit.loop.step.TrainingStep``), fed a fixed batch of random uint8 images augmented on the device (so
that no loader is timed). The FLOPs of one step
(forward and backward of both views, from ``torch.utils.flop_counter``) divided by the median step time
give the achieved FLOP/s; MFU is that over the GPU's dense bf16 peak (:data:`PEAK_BF16`, by device name).
Without a known GPU, MFU is left out and images/s stays.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__" and __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parents[2])  # the repository root, as in train.py

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from sslkit import models  # noqa: E402
from sslkit.augment import TwoViewAugment  # noqa: E402
from sslkit.config import load_config  # noqa: E402
from sslkit.loop import build  # noqa: E402
from sslkit.loop.step import FiniteLoss, TrainingStep  # noqa: E402

# Dense bf16 tensor-core peaks (FLOP/s) from the vendors' data sheets, matched against the device name.
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12, "L4": 121e12}
COMMON = ["method.name=simclr", "loss.name=ntxent", "optim.name=lars", "train.mixed_precision=bf16"]
COMMON += ["model.channels_last=true", "augment.blur_p=0.5", "augment.hflip_p=0.5", "augment.saturation=0.4"]
COMMON += ["model.projector_hidden=2048", "model.projector_out=128"]  # SimCLR's head
MODELS = {
    "resnet18-cifar": ["model.backbone=resnet18", "model.width=64", "model.cifar_stem=true", "augment.image_size=32"],
    "vit-s16": ["model.backbone=vit_small_patch16_224", "augment.image_size=224"],
}
QUICK = {
    "resnet18-cifar": ["model.backbone=resnet18", "model.width=8", "augment.image_size=32"],
    "vit-s16": [
        "model.backbone=vit_tiny_patch16_224",
        "model.kwargs={img_size: 32, depth: 2}",
        "augment.image_size=32",
    ],
}


def peak_flops(device: torch.device) -> tuple[str, float | None]:
    """The device's name and dense bf16 peak (None: not a GPU in :data:`PEAK_BF16`)."""
    if device.type != "cuda":
        return str(device), None
    name = torch.cuda.get_device_name(device)
    return name, peak_of(name)


def peak_of(name: str) -> float | None:
    """``NVIDIA H100 80GB HBM3`` -> H100's peak; the longest matching key wins (``L40S`` over ``L4``)."""
    matches = [key for key in PEAK_BF16 if key in name]
    return PEAK_BF16[max(matches, key=len)] if matches else None


def measure(name: str, overrides: list[str], batch: int, steps: int, warmup: int) -> dict:
    cfg = load_config("quickstart", [*COMMON, *overrides, f"train.batch_size={batch}"])
    accelerator = build.make_accelerator(cfg)
    device = accelerator.device
    augment = TwoViewAugment(cfg.augment, 3, [0.5] * 3, [0.25] * 3).to(device)
    backbone = models.backbone_from_config(cfg.model, 3)
    method = build.make_method(cfg, backbone, 10, batch, device.type)
    optimizer, lr = build.make_optimizer(cfg, method)
    method, optimizer = accelerator.prepare(method, optimizer)
    training_step = TrainingStep(accelerator, method, optimizer, FiniteLoss(accelerator))
    size = cfg.augment.image_size
    images = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, device=device)
    labels = torch.zeros(batch, dtype=torch.long, device=device)
    with torch.no_grad():
        views = augment(images)

    def step() -> None:
        training_step(views, labels, [], lr)

    with FlopCounterMode(display=False) as counter:
        step()
    flops = counter.get_total_flops()
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        _synchronize(device)
        start = time.perf_counter()
        step()
        _synchronize(device)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    gpu, peak = peak_flops(device)
    return {
        "model": name,
        "overrides": overrides,
        "device": gpu,
        "batch": batch,
        "steps": steps,
        "median_step_s": median,
        "images_per_s": batch / median,
        "flops_per_step": flops,
        "achieved_tflops": flops / median / 1e12,
        "mfu": flops / median / peak if peak else None,
        "torch": torch.__version__,
    }


def _synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/bench/gpu_step.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="tiny models, batch 8, 2 steps: a smoke run anywhere")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    table = Table(title="SimCLR training step: bf16 autocast, channels_last, fixed augmented batch")
    for column in ("model", "device", "batch", "step ms", "images/s", "TFLOP/s", "MFU"):
        table.add_column(column, justify="left" if column in ("model", "device") else "right")
    results = []
    for name in args.models:
        overrides = (QUICK if args.quick else MODELS)[name]
        batch, steps, warmup = (8, 2, 1) if args.quick else (args.batch, args.steps, args.warmup)
        r = measure(name, overrides, batch, steps, warmup)
        results.append(r)
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        table.add_row(
            name, r["device"], str(batch), f"{r['median_step_s'] * 1e3:.1f}", f"{r['images_per_s']:.0f}",
            f"{r['achieved_tflops']:.1f}", mfu,
        )  # fmt: skip
    Console().print(table)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
