"""A sweep on SLURM against the same sweep run here: the same tables? And a sweep cancelled midway, run again?

Needs a SLURM cluster's commands on the PATH (``sbatch``, ``squeue``, ``scancel``; ``SLURM_CONF`` where the
cluster is not the machine's default): docs/cluster.md ("Try it on one machine") starts a one-node one.
Three sweeps of the quick start, ``sslkit-ablate quickstart --sweep loss.temperature=0.1,0.2,0.5 --seeds 2``
(6 points), each into a new folder:

1. here, ``--jobs N``: N points at once, each on CPUs / N threads;
2. ``--executor slurm --slurm-cpus CPUS/N``: every point a task of one job array, on as many threads;
3. ``--executor slurm`` again, and once ``--cancel-after`` points have finished and a running one has saved a
   checkpoint, ``scancel`` of every job of it; then the same command again.

The figures: each command's wall time; whether the tables (``results.csv`` and ``summary.csv``, times and the
``skipped`` column aside) of 1, 2 and 3 are identical; in 3, the points the second command skipped as done,
the points it continued and the step each continued from against the step its cancelled run saved at
(nothing redone: equal), and the points it had to start again.

    python tools/bench/slurm_sweep.py                       # the quick start, a rich table
    python tools/bench/slurm_sweep.py --jobs 2 --out slurm_sweep.json --dir runs/bench/slurm_sweep
    python tools/bench/slurm_sweep.py --quick              # tiny points: that it runs
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host import describe_host, host_line  # noqa: E402

SWEEP = ["quickstart", "--sweep", "loss.temperature=0.1,0.2,0.5", "--seeds", "2"]
# --quick: a width-4 network on 8x8 crops, 8 epochs a point, a checkpoint each
QUICK = ["model.width=4", "model.projector_hidden=32", "model.projector_out=16", "augment.image_size=8"]
QUICK += ["train.epochs=8", "train.checkpoint_every_epochs=1"]
QUICK += ["eval.linear_epochs=1", "eval.compare_random_init=false"]
UNCOMPARED = {"wall_s", "cpu_s", "skipped"}  # what may differ between two runs of the same sweep


def ablate(out: Path, *flags: str, quick: bool) -> list[str]:
    return [sys.executable, "-m", "sslkit.cli.ablate", *SWEEP, *(QUICK if quick else []), "--out", str(out), *flags]


def run(command: list[str], log: Path) -> tuple[float, int]:
    """Run ``command``, its output to ``log``; its wall seconds and exit status."""
    start = time.perf_counter()
    with open(log, "w") as out:
        status = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode
    return time.perf_counter() - start, status


def tables(folder: Path) -> dict[str, list[dict]]:
    """results.csv and summary.csv of a sweep, the columns that may differ between two runs of it left out."""
    found = {}
    for name in ("results.csv", "summary.csv"):
        with open(folder / name, newline="") as f:
            found[name] = [{k: v for k, v in row.items() if k not in UNCOMPARED} for row in csv.DictReader(f)]
    return found


def steps_in_logs(folder: Path, suffix: str, pattern: str) -> dict[str, int]:
    """Each point's step in the first line of its ``logs/<point><suffix>`` that matches ``pattern`` (a group around
    the step)."""
    steps = {}
    for log in sorted((folder / "logs").glob(f"*{suffix}")):
        if found := re.search(pattern, log.read_text(errors="replace")):
            steps[log.name.removesuffix(suffix)] = int(found.group(1))
    return steps


def cancel_midway(folder: Path, command: list[str], after: int, timeout: float) -> tuple[float, int, list[str]]:
    """Start the sweep, ``scancel`` its jobs once ``after`` points have finished and a running one has saved;
    its wall seconds, exit status and the points finished before the cancel."""
    start = time.perf_counter()
    with open(folder.parent / f"{folder.name}-first.log", "w") as log:
        sweep = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        while time.perf_counter() - start < timeout and sweep.poll() is None:
            finished = sorted(path.parent.name for path in folder.glob("runs/*/results.json"))
            saving = [
                path for path in folder.glob("runs/*/checkpoints/step-*") if path.parents[1].name not in finished
            ]
            if len(finished) >= after and saving:
                break
            time.sleep(0.5)
        else:
            sweep.kill()
            raise SystemExit(f"the sweep in {folder} ended or took over {timeout:.0f} s before the cancel")
        # submitit names its files after the jobs: <array id>_<task>_submitted.pkl
        arrays = {path.name.split("_")[0] for path in (folder / "logs" / "slurm").glob("*_submitted.pkl")}
        subprocess.run(["scancel", *sorted(arrays)], check=True)
        status = sweep.wait()
    return time.perf_counter() - start, status, finished


def measure(folder: Path, jobs: int, quick: bool, cancel_after: int) -> dict:
    cpus = len(os.sched_getaffinity(0))
    threads = max(1, cpus // jobs)
    local, slurm, cancelled = folder / "local", folder / "slurm", folder / "cancelled"
    for sweep_folder in (local, slurm, cancelled):
        shutil.rmtree(sweep_folder, ignore_errors=True)  # a sweep run before would be skipped, not timed
    on_slurm = ["--executor", "slurm", "--slurm-cpus", str(threads)]
    wall = {}
    wall["local"], status = run(ablate(local, "--jobs", str(jobs), quick=quick), folder / "local.log")
    assert status == 0, f"the local sweep exited {status}: see {folder / 'local.log'}"
    wall["slurm"], status = run(ablate(slurm, *on_slurm, quick=quick), folder / "slurm.log")
    assert status == 0, f"the sweep on SLURM exited {status}: see {folder / 'slurm.log'}"
    command = ablate(cancelled, *on_slurm, quick=quick)
    wall["cancelled"], cancelled_status, done_before = cancel_midway(cancelled, command, cancel_after, 3600)
    saved = steps_in_logs(cancelled, ".err", r"stopped by SIG\w+\s*after step (\d+)")
    wall["again"], status = run(command, folder / "cancelled-again.log")
    assert status == 0, f"the sweep run again exited {status}: see {folder / 'cancelled-again.log'}"
    again_log = (folder / "cancelled-again.log").read_text()
    resumed = steps_in_logs(cancelled, ".out", r"resumed from\s*/\S+?\s*at step (\d+)")
    reference = tables(local)
    points = [row["name"] for row in reference["results.csv"]]
    return {
        "jobs": jobs,
        "cpus": cpus,
        "threads_per_point": threads,
        "quick": quick,
        "command": " ".join(["sslkit-ablate", *SWEEP, *(QUICK if quick else [])]),
        "wall_s": wall,
        "slurm_tables_identical": tables(slurm) == reference,
        "cancelled_tables_identical": tables(cancelled) == reference,
        "cancelled_exit_status": cancelled_status,
        "finished_before_cancel": len(done_before),
        "skipped_again": again_log.count("done, skipped"),
        "saved_at_cancel": saved,
        "resumed_at": resumed,
        "started_again": [name for name in points if name not in done_before and name not in resumed],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="points at once here (default 2)")
    parser.add_argument("--cancel-after", type=int, default=2, help="points finished before the cancel (default 2)")
    parser.add_argument("--dir", type=Path, default=Path("runs/bench/slurm_sweep"), help="where the sweeps go")
    parser.add_argument("--quick", action="store_true", help="tiny points")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args()
    if not shutil.which("sbatch"):
        raise SystemExit("no sbatch on the PATH: start a SLURM cluster (docs/cluster.md, 'Try it on one machine')")
    args.dir.mkdir(parents=True, exist_ok=True)
    result = measure(args.dir.resolve(), args.jobs, args.quick, args.cancel_after)
    result.update(host=describe_host())
    console = Console()
    table = Table(title="a sweep of 6 points here, on SLURM, and on SLURM cancelled midway and run again")
    for column in ("sweep", "wall s", "tables = here"):
        table.add_column(column, justify="right")
    wall = result["wall_s"]
    table.add_row(f"here, --jobs {args.jobs}", f"{wall['local']:.0f}", "")
    table.add_row("--executor slurm", f"{wall['slurm']:.0f}", str(result["slurm_tables_identical"]))
    table.add_row(
        f"cancelled after {result['finished_before_cancel']} points, then again",
        f"{wall['cancelled']:.0f} + {wall['again']:.0f}",
        str(result["cancelled_tables_identical"]),
    )
    console.print(table)
    continued = ", ".join(f"{name} at step {step}" for name, step in result["resumed_at"].items()) or "none"
    console.print(
        f"cancelled sweep: exit status {result['cancelled_exit_status']}; run again: {result['skipped_again']} points "
        f"skipped as done, continued: {continued}; saved at the cancel: {result['saved_at_cancel']}; started again: "
        f"{result['started_again'] or 'none'}"
    )
    console.print(host_line(result["host"]))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
        console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
