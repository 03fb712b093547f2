"""What ``train.mixed_precision=bf16`` buys on this CPU: a recipe's training step in bf16 autocast against fp32,
and the share of each that the backbone's forward + backward takes.

    python tools/bench/precision.py [--recipe recipes/fashion_mnist_simclr.yaml] [overrides ...] [--threads N]
                                    [--steps N] [--quick] [--out JSON]

The method and optimizer are built once, by the training loop's own builders (``tools/bench/train.py``'s
``build_pieces``, in fp32). One fixed augmented batch of the recipe's loader then goes through two kinds of work,
each in fp32 and in bf16 autocast (``torch.autocast(device, torch.bfloat16)``, the context Accelerate enters for
``mixed_precision="bf16"``; Accelerate cannot switch precision within one process, so the bench enters it
itself):

- ``step``: the loop's own step (``TrainingStep``): forward of backbone, head and loss, backward, optimizer step.
- ``backbone``: the backbone's forward and backward on the same views (the mean of its features as the loss).

``step - backbone`` is what the head, the loss, the optimizer and the casts cost. Augmentation runs outside
autocast in the loop (its cost does not depend on the precision; ``tools/bench/train.py`` times it). The four
measurements alternate step by step, so that load drift on a shared machine hits all of them alike. The headline
is ``fp32 step / bf16 step`` (medians): above 1, bf16 trains faster.

Which kernels oneDNN picks decides the answer: on a CPU with AMX (Intel Sapphire Rapids and later) bf16
convolutions run on AMX tiles, on AVX512-BF16 CPUs (AMD EPYC Zen 4) on vector dot products; small feature maps
and narrow layers can make either slower than fp32. The CPU's bf16 features are recorded with the figures.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__" and __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parents[2])  # the repository root, as in train.py

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from tools.bench.compile import fixed_batch, run_step_benchmark  # noqa: E402
from tools.bench.host import describe_host, host_line  # noqa: E402
from tools.bench.train import build_pieces, optimizer_step, resolve_config  # noqa: E402

PRECISIONS = ("fp32", "bf16")
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile")  # /proc/cpuinfo's names


def cpu_bf16_flags() -> list[str]:
    """The bf16 features the CPU reports (Linux's ``/proc/cpuinfo``; empty elsewhere)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return []
    return [flag for flag in BF16_FLAGS if flag in flags.split()]


def autocast(precision: str, device: torch.device):
    """bf16 autocast on ``device``, or nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def backbone_pass(backbone: torch.nn.Module, views: tuple[torch.Tensor, ...], precision: str) -> None:
    """Forward and backward of the backbone alone on every view at once, as the methods batch them."""
    with autocast(precision, views[0].device):
        features = backbone(torch.cat(views))
    features.float().mean().backward()
    backbone.zero_grad(set_to_none=True)


def timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def measure(recipe, overrides, quick: bool, threads: int, steps: int, warmup: int) -> dict:
    cfg, recipe_path, used, note = resolve_config(recipe, [*overrides, "train.mixed_precision=no"], quick, threads)
    torch.manual_seed(cfg.run.seed)
    pieces = build_pieces(cfg, total_steps=len(PRECISIONS) * (warmup + steps))
    view1, view2, labels, *indices = fixed_batch(pieces)
    backbone, device = pieces.step.unwrapped.backbone, pieces.accelerator.device
    times = {(kind, p): [] for kind in ("step", "backbone") for p in PRECISIONS}
    step = 0
    for round_ in range(warmup + steps):  # the first rounds warm oneDNN's kernels for both precisions, untimed
        for precision in PRECISIONS:
            with autocast(precision, device):
                step_s = timed(lambda: optimizer_step(pieces, view1, view2, labels, step, *indices))
            backbone_s = timed(lambda: backbone_pass(backbone, (view1, view2), precision))
            step += 1
            if round_ >= warmup:
                times["step", precision].append(step_s)
                times["backbone", precision].append(backbone_s)
    median = {f"{kind}_{p}": statistics.median(values) for (kind, p), values in times.items()}
    batch = cfg.train.batch_size
    return {
        "recipe": str(recipe_path),
        "overrides": used,
        "note": note,
        "backbone": cfg.model.backbone,
        "model": {"width": cfg.model.width, "cifar_stem": cfg.model.cifar_stem, "image_size": cfg.augment.image_size},
        "batch_size": batch,
        "threads": threads,
        "steps": steps,
        "warmup_steps": warmup,
        "median_s": median,
        "images_per_s": {p: batch / median[f"step_{p}"] for p in PRECISIONS},
        "speedup": median["step_fp32"] / median["step_bf16"],
        "backbone_speedup": median["backbone_fp32"] / median["backbone_bf16"],
        "device": str(device),
        "host": describe_host(),
        "cpu_bf16_flags": cpu_bf16_flags(),
        "torch": torch.__version__,
        "load_average": os.getloadavg()[0],
    }


def render(result: dict, console: Console) -> None:
    model = result["model"]
    stem = "CIFAR stem" if model["cifar_stem"] else "7x7 stem + max-pool"
    table = Table(
        title=f"bf16 autocast against fp32: {result['backbone']} width {model['width']} ({stem}), "
        f"{model['image_size']} px, batch {result['batch_size']}, {result['threads']} thread(s), {result['device']}",
        caption=f"medians of {result['steps']} interleaved rounds after {result['warmup_steps']} warm-up",
    )
    for column in ("precision", "images/s", "step ms", "backbone fwd+bwd ms", "rest of the step ms"):
        table.add_column(column, justify="left" if column == "precision" else "right")
    median = result["median_s"]
    for p in PRECISIONS:
        step, backbone = median[f"step_{p}"], median[f"backbone_{p}"]
        rest = f"{(step - backbone) * 1e3:.1f}"
        table.add_row(p, f"{result['images_per_s'][p]:.0f}", f"{step * 1e3:.1f}", f"{backbone * 1e3:.1f}", rest)
    console.print(table)
    console.print(
        f"fp32 / bf16: step [bold]{result['speedup']:.2f}x[/], backbone {result['backbone_speedup']:.2f}x "
        f"(above 1: bf16 faster)"
    )
    flags = ", ".join(result["cpu_bf16_flags"]) or "none"
    console.print(f"host: {host_line(result['host'])}; bf16 features: {flags}; torch {result['torch']}")
    if result.get("note"):
        console.print(f"[yellow]note:[/] {result['note']}")


def main(argv: list[str] | None = None) -> int:
    description = __doc__.split("\n\n")[0]
    return run_step_benchmark("tools/bench/precision.py", description, "model.cifar_stem=true", measure, render, argv)


if __name__ == "__main__":
    sys.exit(main())
