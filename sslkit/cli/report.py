"""Render the Markdown report of past runs: config, final metrics, training curves.

    sslkit-report runs/quickstart [RUN_DIR ...]
    sslkit-report runs/ablate-quickstart-loss.temperature/runs/*

Each RUN_DIR gets ``RUN_DIR/report.md`` (see :mod:`sslkit.experiments.report`); with matplotlib installed
(``pip install "sslkit[plot]"``) the curves are PNGs next to it. A run still training gets a
partial report. A directory that is not a run prints one line and the exit status is 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sslkit.cli.early_checks import is_run_dir
from sslkit.console import console, print_user_error
from sslkit.errors import UserError, install_hint

# sslkit.experiments.report (numpy, torch) is imported once there is a run to report on: --help, and directories
# that are no runs, answer at once.


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="sslkit-report", description="Write report.md (config, metrics, curves) for past runs."
    )
    parser.add_argument(
        "run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="a run directory, e.g. runs/quickstart"
    )
    return parser.parse_args(argv)


def not_a_run(path: Path) -> UserError:
    """The one-line error for a directory that is not a run, pointing at runs inside it if there are any."""
    if not path.is_dir():
        return UserError(f"'{path}' is not a directory; give a run directory, e.g. runs/quickstart")
    inside = sorted(p for p in path.glob("*") if is_run_dir(p)) + sorted(
        p for p in path.glob("runs/*") if is_run_dir(p)
    )
    if inside:
        return UserError(
            f"'{path}' is not a run directory (no config.yaml) but holds run directories; "
            f"give those instead, e.g. sslkit-report {inside[0].parent}/*"
        )
    return UserError(
        f"'{path}' is not a run directory (no config.yaml); give one that sslkit-pretrain wrote, e.g. runs/quickstart"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not any(map(is_run_dir, args.run_dirs)):
        for run_dir in args.run_dirs:
            print_user_error(not_a_run(run_dir))
        return 2
    from sslkit.experiments.report import have_matplotlib, write_report

    status, written = 0, 0
    for run_dir in args.run_dirs:
        try:
            if not is_run_dir(run_dir):
                raise not_a_run(run_dir)
            console.print(f"report: {write_report(run_dir)}", markup=False, highlight=False, soft_wrap=True)
            written += 1
        except UserError as error:
            print_user_error(error)
            status = 2
    if written and not have_matplotlib():
        console.print(f"plots are text tables: {install_hint('plot')} adds PNG curves", markup=False, highlight=False)
    return status


if __name__ == "__main__":
    sys.exit(main())
