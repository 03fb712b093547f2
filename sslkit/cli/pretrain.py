"""Pretrain an encoder from a recipe.

    sslkit-pretrain recipes/quickstart.yaml train.epochs=5 loss.temperature=0.2
    sslkit-pretrain quickstart          # a bundled recipe by name, from any directory
    accelerate launch -m sslkit.cli.pretrain recipes/simclr.yaml [key.sub=value ...]

A user's mistake (unknown key, wrong type, missing dataset, ...) prints one line and exits
with status 2; nothing half-done is written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# The parser lives beside the argv builder that the experiments start this command with.
from sslkit.command_lines.pretrain import parse_args


def check_early(args: argparse.Namespace) -> None:
    """The recipe's name and its keys and types with the overrides, before torch is imported."""
    from sslkit.cli.early_checks import recipe_with_overrides

    recipe_with_overrides(args.recipe, args.overrides)


def main(argv: list[str] | None = None) -> int:
    from sslkit.cli.early_checks import refused
    from sslkit.cli.options import reject_unknown_option
    from sslkit.console import print_user_error
    from sslkit.errors import REQUEUE_EXIT_STATUS, Preempted, UserError

    if reject_unknown_option(sys.argv[1:] if argv is None else argv, ()):
        return 2
    args = parse_args(argv)
    if refused(check_early, args):
        return 2
    from sslkit.loop.launch import relaunch_cpu_processes, stop_with_launcher

    if argv is None:  # a process of its own: it ends with its launcher until the recipe names its stop signals
        stop_with_launcher(["SIGTERM"])
        if (code := relaunch_cpu_processes()) is not None:
            return code
    from sslkit.config import load_config
    from sslkit.loop import make_run_dir, train

    cfg = None
    try:
        cfg = load_config(args.recipe, args.overrides)
        if argv is None:  # from now on its launcher's exit is a stop signal
            stop_with_launcher(cfg.train.stop_signals)
        train(cfg, exit_after_stop=True)  # this process exits with 75 once the run has stopped
        if os.environ.get("RANK", "0") == "0":
            print_run_directory(make_run_dir(cfg))
    except UserError as error:
        print_user_error(error)
        return 2
    except Preempted as stopped:  # train.stop_signals: saved; a batch script requeues on the exit status
        if os.environ.get("RANK", "0") == "0":
            say_stopped(f"{stopped}: saved {stopped.checkpoint}; continue with run.resume=auto "
                        f"(exit status {REQUEUE_EXIT_STATUS}: requeue)")  # fmt: skip
        return REQUEUE_EXIT_STATUS
    except KeyboardInterrupt:  # Ctrl-C: a user's choice, not a crash; every checkpoint written so far is whole
        if os.environ.get("RANK", "0") == "0":  # one line, not one per process
            from sslkit.console import error_console

            error_console.print(interrupted_message(cfg), highlight=False, soft_wrap=True)
        return 130
    return 0


def say_stopped(line: str) -> None:
    """The stop line on stderr, where stderr may be gone: ``accelerate launch`` reads its processes' stderr through
    a pipe, and dies of SIGUSR1 (SLURM's signal) at once. The run has saved; its exit status, 75, must survive a
    line nobody can read (rich answers a broken pipe by exiting with status 1: the line is written without it)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())  # nor may the interpreter's last flush fail


def print_run_directory(run_dir) -> None:
    """The run's report, written beside what training left, and one line naming the directory's contents."""
    from sslkit.console import console
    from sslkit.experiments.report import write_report

    report = write_report(run_dir)
    console.print(
        f"run directory: {run_dir}  (report: {report.name}; "
        f"backbone.safetensors, checkpoints/, metrics.jsonl, config.yaml, results.json)"
    )


def interrupted_message(cfg) -> str:
    """What Ctrl-C leaves: the checkpoint ``run.resume=auto`` continues from, or (before the first one) nothing."""
    from sslkit.errors import UserError
    from sslkit.loop import make_run_dir
    from sslkit.loop.run_directory import newest_intact
    from sslkit.loop.state import LoopState
    from sslkit.models.weights import PROGRESS_FILE

    try:
        newest = newest_intact(make_run_dir(cfg))[0] if cfg is not None else None
    except UserError as error:  # every checkpoint damaged: that is what the user needs to hear
        return f"interrupted: {error}"
    if newest is not None:
        step = LoopState(**json.loads((newest / PROGRESS_FILE).read_text())).step
        return f"interrupted: run.resume=auto continues from {newest} (step {step})"
    return (
        "interrupted before the first checkpoint: nothing to continue from; run.resume=auto starts the run over "
        "in the same directory (train.checkpoint_every_steps saves sooner)"
    )


if __name__ == "__main__":
    sys.exit(main())
