"""What ``train.compile`` buys: the training step of a recipe compiled with ``torch.compile`` against the same
step run eagerly, in one process, interleaved.

    python tools/bench/compile.py [--recipe recipes/fashion_mnist_simclr.yaml] [--steps N] [--quick] [--out JSON]

Both methods are built by the training loop's own builders (``tools/bench/train.py``'s ``build_pieces``) from
the same recipe and seed, one with ``train.compile=true``; their first steps (``--warmup``) are untimed, which is
where compilation happens (its time is reported separately: what a run pays once). Then floor steps
(forward, backward and optimizer step on one fixed augmented batch) alternate between the two, so that load
on a shared machine hits both alike. The headline is ``eager step / compiled step`` (medians): above 1, the
compiled method trains faster.
"""

from __future__ import annotations

import argparse
import json
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

from tools.bench.train import EndlessBatches, build_pieces, resolve_config, time_floor_steps  # noqa: E402

FULL_STEPS, QUICK_STEPS = 20, 3
FULL_WARMUP, QUICK_WARMUP = 3, 2


def fixed_batch(pieces) -> tuple[torch.Tensor, ...]:
    """One augmented batch of the recipe's loader (the floor steps' input)."""
    images, labels, *indices = EndlessBatches(pieces).next()
    with torch.no_grad():
        return (*pieces.augment(images), labels, *indices)


def measure(recipe, overrides, quick: bool, threads: int, steps: int, warmup: int) -> dict:
    kinds = {"eager": ["train.compile=false"], "compiled": ["train.compile=true"]}
    pieces, views, compile_s = {}, {}, {}
    for kind, extra in kinds.items():
        cfg, recipe_path, used, note = resolve_config(recipe, [*overrides, *extra], quick, threads)
        torch.manual_seed(cfg.run.seed)
        pieces[kind] = build_pieces(cfg, total_steps=2 * (warmup + steps))
        views[kind] = fixed_batch(pieces[kind])
        start = time.perf_counter()
        time_floor_steps(pieces[kind], views[kind], warmup)  # the compiled method compiles here
        compile_s[kind] = time.perf_counter() - start
    times = {kind: [] for kind in kinds}
    for step in range(warmup, warmup + steps):
        for kind in kinds:
            times[kind] += [r["total"] for r in time_floor_steps(pieces[kind], views[kind], 1, first_step=step)]
    median = {kind: statistics.median(values) for kind, values in times.items()}
    batch = cfg.train.batch_size
    return {
        "recipe": str(recipe_path),
        "overrides": used,
        "note": note,
        "backend": cfg.train.compile_backend,  # the compiled run's config: the last one built
        "backbone": cfg.model.backbone,
        "batch_size": batch,
        "threads": threads,
        "steps": steps,
        "warmup_steps": warmup,
        "warmup_s": compile_s,
        "median_step_s": median,
        "images_per_s": {kind: batch / value for kind, value in median.items()},
        "speedup": median["eager"] / median["compiled"],
        "device": str(pieces["eager"].accelerator.device),
        "torch": torch.__version__,
        "load_average": os.getloadavg()[0],
    }


def render(result: dict, console: Console) -> None:
    table = Table(
        title=f"train.compile ({result['backend']}): {result['backbone']}, batch {result['batch_size']}, "
        f"{result['threads']} thread(s), {result['device']}",
        caption=f"floor steps (fwd + bwd + optimizer step), medians of {result['steps']} interleaved steps",
    )
    for column in ("method", "images/s", "step ms", "first steps s"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for kind in ("eager", "compiled"):
        table.add_row(
            kind,
            f"{result['images_per_s'][kind]:.0f}",
            f"{result['median_step_s'][kind] * 1e3:.1f}",
            f"{result['warmup_s'][kind]:.1f}",
        )
    console.print(table)
    console.print(f"speed-up (eager step / compiled step): [bold]{result['speedup']:.2f}x[/]")
    if result.get("note"):
        console.print(f"[yellow]note:[/] {result['note']}")


def run_step_benchmark(prog: str, description: str, example: str, measure, render, argv: list[str] | None) -> int:
    """The command line of a benchmark that compares two ways of running a recipe's step (this one and
    ``precision.py``): ``measure(recipe, overrides, quick, threads, steps, warmup)`` returns the figures,
    ``render(result, console)`` prints them; ``--out`` writes them as JSON."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--recipe", type=Path, help="YAML recipe (default: as tools/bench/train.py)")
    parser.add_argument("overrides", nargs="*", help=f"key=value overrides, e.g. {example}")
    parser.add_argument("--steps", type=int, help=f"timed steps of each (default {FULL_STEPS}, --quick {QUICK_STEPS})")
    parser.add_argument("--warmup", type=int, help=f"untimed first steps (default {FULL_WARMUP})")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as tools/bench/train.py)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: a small model, a few steps")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    from sslkit.console import print_user_error
    from sslkit.errors import UserError

    steps = args.steps or (QUICK_STEPS if args.quick else FULL_STEPS)
    warmup = args.warmup if args.warmup is not None else (QUICK_WARMUP if args.quick else FULL_WARMUP)
    try:
        result = measure(args.recipe, args.overrides, args.quick, args.threads, steps, warmup)
    except UserError as error:
        print_user_error(error)
        return 2
    render(result, Console())
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    description = __doc__.split("\n\n")[0]
    return run_step_benchmark(
        "tools/bench/compile.py", description, "train.compile_backend=aot_eager", measure, render, argv
    )


if __name__ == "__main__":
    sys.exit(main())
