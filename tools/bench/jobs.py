"""An experiment's runs side by side (``--jobs N``) against one at a time: wall time, and the same numbers?

The quick start is pretrained once, with every CPU thread; then each round runs a label-efficiency grid on it
(by default 5% and 10% of the labels, two seeds: 20 runs, as in docs/results.md) twice, into new folders, in
turn (so that load on the machine hits both): one run at a time with every thread (``OMP_NUM_THREADS`` = the
CPUs), and ``--jobs N``, each run on its share of the threads (CPUs / N). The figures: each command's wall
time, their ratio, the runs' CPU seconds, and whether every run gave the same test top-1 both ways, run by run
(``points.csv``). A run's floats depend on its thread count (sums split between threads are added in another
order), so the grid runs once more one at a time on the threads each of ``--jobs N``'s runs had: that one must
give the figures of ``--jobs N`` exactly.

    python tools/bench/jobs.py                        # 2 rounds of the grid, a rich table
    python tools/bench/jobs.py --jobs 2 --rounds 3 --out jobs.json --dir runs/bench/jobs
    python tools/bench/jobs.py --fractions 0.05 --rounds 1     # half the grid
    python tools/bench/jobs.py --quick                # tiny runs, one round: that it runs
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host import describe_host, host_line  # noqa: E402

# --quick: a width-4 network on 8x8 crops, a step or two a run
QUICK = [
    "model.width=4",
    "model.projector_hidden=32",
    "model.projector_out=16",
    "augment.image_size=8",
    "eval.linear_epochs=1",
    "eval.compare_random_init=false",
    "eval.compare_raw_pixels=false",
]
QUICK_GRID = ["--fractions", "0.1", "--seeds", "1", "--scratch-factor", "1", "--finetune-override", "train.epochs=1"]


def run(argv: list[str], log: Path, threads: int | None) -> float:
    """Run ``python -m ARGV`` (``OMP_NUM_THREADS=threads`` when given), its output to ``log``; its wall seconds."""
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    start = time.perf_counter()
    with open(log, "w") as out:
        status = subprocess.run(
            [sys.executable, "-m", *argv], stdout=out, stderr=subprocess.STDOUT, env=env
        ).returncode
    if status:
        raise SystemExit(f"{' '.join(argv)} exited with {status}; see {log}")
    return time.perf_counter() - start


def points(folder: Path) -> dict[tuple[str, str], dict]:
    """The rows of a grid's points.csv by (road, run)."""
    with open(folder / "points.csv", newline="") as f:
        return {(row["road"], row["run"]): row for row in csv.DictReader(f)}


def cpu_seconds(folder: Path) -> float:
    """The CPU seconds of every run of a grid, all its processes (points.json's runs)."""
    return sum(run["cpu_s"] for run in json.loads((folder / "points.json").read_text())["runs"])


def measure(folder: Path, jobs: int, rounds: int, quick: bool, fractions: str, seeds: int) -> dict:
    cpus = len(os.sched_getaffinity(0))
    tiny = QUICK if quick else []
    pretrained = folder / "runs" / "quickstart"
    if not (pretrained / "results.json").is_file():
        pretrain = ["sslkit.cli.pretrain", "quickstart", *tiny, f"run.output_dir={folder / 'runs'}"]
        run(pretrain + (["train.epochs=1"] if quick else []), folder / "pretrain.log", cpus)
    grid = ["sslkit.cli.label_efficiency", "quickstart", *tiny, "--pretrained", str(pretrained)]
    grid += QUICK_GRID if quick else ["--fractions", fractions, "--seeds", str(seeds)]
    walls: dict[str, list[float]] = {"alone": [], "jobs": []}
    for index in range(rounds):
        alone, together = folder / f"alone-{index}", folder / f"jobs{jobs}-{index}"
        for grid_folder in (alone, together):
            shutil.rmtree(grid_folder, ignore_errors=True)  # a grid run before would be skipped, not timed
        walls["alone"].append(run([*grid, "--out", str(alone)], folder / f"{alone.name}.log", cpus))
        walls["jobs"].append(
            run([*grid, "--jobs", str(jobs), "--out", str(together)], folder / f"{together.name}.log", None)
        )
    # once more one at a time, on the threads each of --jobs N's runs had: the same floats, so the same figures
    one_thread = folder / "alone-one-thread"
    shutil.rmtree(one_thread, ignore_errors=True)
    walls["alone_one_thread"] = [
        run([*grid, "--out", str(one_thread)], folder / f"{one_thread.name}.log", max(1, cpus // jobs))
    ]
    first, second, same_threads = points(folder / "alone-0"), points(folder / f"jobs{jobs}-0"), points(one_thread)
    differences = [abs(float(first[key]["top1"]) - float(second[key]["top1"])) for key in first]
    same_thread_differences = [abs(float(same_threads[key]["top1"]) - float(second[key]["top1"])) for key in first]
    cpu = {name: cpu_seconds(folder / f"{prefix}-0") for name, prefix in (("alone", "alone"), ("jobs", f"jobs{jobs}"))}
    return {
        "jobs": jobs,
        "cpus": cpus,
        "rounds": rounds,
        "quick": quick,
        "command": " ".join(["python -m", *grid]),
        "wall_s": walls,
        "ratio": [a / b for a, b in zip(walls["alone"], walls["jobs"])],
        "runs": len(first),
        "same_top1": sum(d == 0 for d in differences),
        "largest_difference": max(differences),
        "same_top1_same_threads": sum(d == 0 for d in same_thread_differences),
        "largest_difference_same_threads": max(same_thread_differences),
        "cpu_s_first_round": cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (default 2)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the two commands, in turn (default 2)")
    parser.add_argument("--fractions", default="0.05,0.1", help="the grid's label fractions (default 0.05,0.1)")
    parser.add_argument("--seeds", type=int, default=2, help="the grid's seeds (default 2)")
    parser.add_argument("--dir", type=Path, default=Path("runs/bench/jobs"), help="where the runs go (new folders)")
    parser.add_argument("--quick", action="store_true", help="tiny runs, one round")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    rounds = 1 if args.quick else args.rounds
    result = measure(args.dir.resolve(), args.jobs, rounds, args.quick, args.fractions, args.seeds)
    result.update(host=describe_host(), load_average_1min=[load_before, os.getloadavg()[0]])
    table = Table(title=f"the label-efficiency grid: one run at a time against --jobs {args.jobs}")
    for column in ("round", f"alone, {result['cpus']} threads: wall s", f"--jobs {args.jobs}: wall s", "ratio"):
        table.add_column(column, justify="right")
    for index, (alone, together) in enumerate(zip(result["wall_s"]["alone"], result["wall_s"]["jobs"])):
        table.add_row(str(index), f"{alone:.0f}", f"{together:.0f}", f"{alone / together:.2f}x")
    console = Console()
    console.print(table)
    console.print(
        f"median ratio {statistics.median(result['ratio']):.2f}x; the same test top-1 on {result['same_top1']} of "
        f"{result['runs']} figures (largest difference {result['largest_difference']:.4f}); one at a time on "
        f"{max(1, result['cpus'] // args.jobs)} thread(s) a run, as --jobs gives each "
        f"({result['wall_s']['alone_one_thread'][0]:.0f} s): "
        f"the same on {result['same_top1_same_threads']} of {result['runs']} (largest difference "
        f"{result['largest_difference_same_threads']:.4f}); CPU seconds of the runs, first round: alone "
        f"{result['cpu_s_first_round']['alone']:.0f}, --jobs {result['cpu_s_first_round']['jobs']:.0f}"
    )
    loads = " -> ".join(f"{load:.1f}" for load in result["load_average_1min"])
    console.print(f"{host_line(result['host'])}; load average (1 min) {loads}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
        console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
