"""Evaluate a trained encoder: weighted kNN, linear probe (and retrieval on held-out classes).

    sslkit-evaluate runs/quickstart [key.sub=value ...] [--out results.json]
    accelerate launch --num_processes 2 -m sslkit.cli.evaluate runs/quickstart/checkpoints/step-00000420

RUN_OR_CHECKPOINT is a run directory (its config.yaml and backbone are used), a checkpoint
directory inside one, or an exported backbone file together with ``--recipe``. The evaluation is
:mod:`sslkit.evaluation.evaluate`'s; this command parses its options, starts the processes and
prints the results.
"""

from __future__ import annotations

import argparse
import sys

# The parser lives beside the argv builder that the experiments start this command with.
from sslkit.command_lines.evaluate import OPTIONS, parse_args


def check_early(args: argparse.Namespace) -> None:
    """What is evaluated, and the recipe given for it, before torch is imported (the run's own config.yaml is
    found by :func:`sslkit.evaluation.evaluate.plan_evaluation`)."""
    from sslkit.cli.early_checks import existing_path, recipe_with_overrides

    existing_path(args.target, "a run directory (runs/<name>), a checkpoint, or a backbone file")
    if args.recipe:
        recipe_with_overrides(args.recipe, args.overrides)


def main(argv: list[str] | None = None) -> int:
    from sslkit.cli.early_checks import refused
    from sslkit.cli.options import reject_unknown_option
    from sslkit.console import print_user_error
    from sslkit.errors import UserError

    if reject_unknown_option(sys.argv[1:] if argv is None else argv, OPTIONS):
        return 2
    args = parse_args(argv)
    if refused(check_early, args):
        return 2
    from sslkit.loop.launch import cpu_threads, relaunch_cpu_processes

    if argv is None and (code := relaunch_cpu_processes()) is not None:
        return code
    from accelerate import Accelerator

    from sslkit.console import console, results_table
    from sslkit.evaluation.evaluate import plan_evaluation, run_evaluation

    try:
        plan = plan_evaluation(args.target, args.recipe, args.overrides, args.out)
        accelerator = Accelerator(mixed_precision="no")
        if accelerator.device.type == "cpu":
            cpu_threads(None)  # accelerate launch may have pinned one thread (sslkit/loop/launch.py)
        evaluation = run_evaluation(plan, linear=not args.no_linear, accelerator=accelerator)
    except UserError as error:
        print_user_error(error)
        return 2
    if evaluation.main_process:
        console.print(results_table(evaluation.results, f"{plan.target}: {plan.cfg.data.name}"))
        for note in evaluation.notes:
            console.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
        console.print(f"results written to {plan.out}")
    # Leave together and close the process group (as the trainer does): a process that exits
    # while another still tears down its gloo connections can abort.
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
