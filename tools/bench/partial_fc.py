"""Partial FC against the full ArcFace head: peak memory per process and step time, 1 and 2 processes.

Not a test: it measures, it does not assert. Synthetic embeddings (``--batch`` per process, D =
``--dim``) and labels uniform over C = ``--classes`` classes; a step is the head's forward and
backward and an AdamW step over the head (torch's fused AdamW: no full-size temporaries in the
step). Each configuration runs in fresh processes (gloo on the CPU for 2), one torch thread each
by default:

* ``full``: ``ArcFaceHead`` holding every class on every process; with 2 processes its weight
  gradient is averaged with an all-reduce, as DDP would.
* ``partial_fc`` at each ``--rates``: ``ArcFaceHead(partial_fc=True, sample_rate=r)``, a block of
  C / W classes per process.

``--thp`` sets ``THP_MEM_ALLOC_ENABLE=1`` for the workers: torch's CPU allocator then asks the
kernel for transparent huge pages for large tensors (``madvise``), so writing a fresh gradient
faults 2 MiB pages instead of 4 KiB ones. A Partial FC step allocates and zero-fills its block's
whole gradient however few rows it sampled, which makes page faults a large share of its time.

Peak memory: Linux ``VmHWM`` (after resetting it through ``/proc/self/clear_refs``) minus
``VmRSS`` before the head is built, per process (torch has no CPU allocator statistics and
``tracemalloc`` does not see its allocations). The aim it is set against:
``(C / W) x D x 4 bytes x 3`` (weights and AdamW's two moments) plus the sampled (N, S) fp32
logits, N the global batch; the table also gives the gradient's share, one more ``(C / W) x D x 4``.
Step time: the median over ``--steps`` steps after one warm-up step, each step ended by a
barrier, so it is the slowest process's.

A full head too large for ``--memory-budget`` (all processes together, estimated) is measured
at the largest C / 2^k that fits, and its row says which C it ran.

Usage::

    python tools/bench/partial_fc.py                     # C = 1,000,000, D = 512, batch 256 (many minutes)
    python tools/bench/partial_fc.py --quick             # C = 20,000: seconds
    python tools/bench/partial_fc.py --processes 2 --rates 0.1 --out runs/bench/partial_fc.json
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from host import describe_host, host_line  # tools/bench/host.py: this script's folder is on sys.path
from rich.console import Console
from rich.table import Table

from sslkit.losses import ArcFaceHead
from sslkit.losses.partial_fc import shard_bounds

MIB = 2**20


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def _resident_baseline() -> int:
    """VmRSS in bytes once freed memory is handed back, with the peak reset to it."""
    gc.collect()
    with contextlib.suppress(Exception):  # glibc only
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    return 1024 * _status_kb("VmRSS")


def _worker(rank: int, world: int, port: int, out_dir: str, config: dict) -> None:
    torch.set_num_threads(config["threads"])
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    classes, dim, batch = config["classes"], config["dim"], config["batch"]
    torch.manual_seed(0)
    partial = config["rate"] is not None
    # One step of a tiny head first: the memory torch takes once (thread pools, kernels' first
    # use) is then in the baseline, and the peak is what the head of C classes adds.
    _steps(ArcFaceHead(dim, 2 * world, partial_fc=partial, sample_rate=config["rate"] or 1.0), 2 * world, batch, 1)
    baseline = _resident_baseline()
    head = ArcFaceHead(dim, classes, partial_fc=partial, sample_rate=config["rate"] or 1.0)
    times = _steps(head, classes, batch, config["steps"] + 1)
    result = {"peak_bytes": 1024 * _status_kb("VmHWM") - baseline, "step_s": times[1:], "rows": head.weight.shape[0]}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    if world > 1:
        dist.destroy_process_group()


def _steps(head: ArcFaceHead, classes: int, batch: int, steps: int) -> list[float]:
    """``steps`` training steps of ``head`` alone (AdamW) on random embeddings; each one's seconds."""
    world, dim = dist.get_world_size() if dist.is_initialized() else 1, head.embedding_dim
    partial = head.partial_fc is not None
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-3, fused=True)
    generator = torch.Generator().manual_seed(1000 + (dist.get_rank() if world > 1 else 0))
    times = []
    for _ in range(steps):
        x = torch.randn(batch, dim, generator=generator).requires_grad_()
        labels = torch.randint(0, classes, (batch,), generator=generator)
        if world > 1:
            dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        head(x, labels).backward()
        if world > 1 and not partial:  # what DDP does with a replicated head
            dist.all_reduce(head.weight.grad)
            head.weight.grad.div_(world)
        optimizer.step()
        if world > 1:
            dist.barrier()
        times.append(time.perf_counter() - start)
    return times


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_config(config: dict, world: int) -> list[dict]:
    """One configuration in ``world`` fresh processes; each one's result."""
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_worker, args=(world, _free_port(), out_dir, config), nprocs=world, join=True)
        return [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(world)]


def sampled_columns(classes: int, world: int, rate: float, global_batch: int) -> int:
    """The largest number of centres a process samples: ``int(rate x block)``, or the positives
    when more (at most one per sample of the global batch)."""
    start, stop = shard_bounds(classes, 0, world)
    return stop - start if rate >= 1 else max(int(rate * (stop - start)), min(global_batch, stop - start))


def aim_bytes(classes: int, dim: int, world: int, columns: int, global_batch: int) -> tuple[int, int]:
    """(weights + AdamW's two moments, plus the (N, S) logits; the gradient's bytes), per process."""
    start, stop = shard_bounds(classes, 0, world)
    block = (stop - start) * dim * 4
    return 3 * block + global_batch * columns * 4, block


def full_head_classes(classes: int, dim: int, batch: int, world: int, budget: float) -> int:
    """The largest C / 2^k whose full head fits ``budget`` bytes over all processes, estimated as
    weights, gradient, two moments, one reused (C, D) buffer and the (batch, C) logits."""
    while classes > 1000 and world * classes * (5 * dim + batch) * 4 > budget:
        classes //= 2
    return classes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--classes", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256, help="embeddings per process")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.1, 1.0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=3, help="timed steps, after one warm-up step")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--memory-budget", type=float, default=14.0, help="GiB for a full head, all processes")
    parser.add_argument(
        "--thp",
        action="store_true",
        help="THP_MEM_ALLOC_ENABLE=1 in the workers: torch asks for transparent huge pages for large CPU tensors",
    )
    parser.add_argument("--quick", action="store_true", help="C = 20,000 and 2 steps: seconds, a smoke run")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.classes, args.steps = 20_000, 2
    if args.thp:  # read by torch's CPU allocator; the spawned workers inherit it
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"
    console = Console()
    host = describe_host()
    huge_pages = "transparent huge pages asked for" if args.thp else "default pages"
    console.print(f"host: {host_line(host)}; {args.threads} torch thread(s) per process; {huge_pages}")
    rows = []
    for world in args.processes:
        full_classes = full_head_classes(args.classes, args.dim, args.batch, world, args.memory_budget * 2**30)
        runs = [("full", None, full_classes)] + [("partial_fc", rate, args.classes) for rate in args.rates]
        if full_classes != args.classes:  # Partial FC at the full head's C too, for a like-for-like time
            runs += [("partial_fc", rate, full_classes) for rate in args.rates]
        for kind, rate, classes in runs:
            config = dict(
                classes=classes, dim=args.dim, batch=args.batch, rate=rate, steps=args.steps, threads=args.threads
            )
            results = run_config(config, world)
            n = world * args.batch
            columns = classes if rate is None else sampled_columns(classes, world, rate, n)
            aim, gradient = aim_bytes(
                classes, args.dim, 1 if rate is None else world, columns, n if rate else args.batch
            )
            row = dict(
                kind=kind,
                rate=rate,
                processes=world,
                classes=classes,
                peak_mib=[r["peak_bytes"] / MIB for r in results],
                aim_mib=aim / MIB,
                gradient_mib=gradient / MIB,
                step_s=statistics.median(max(times) for times in zip(*(r["step_s"] for r in results))),
            )
            rows.append(row)
            console.print(row)
    for row in rows:  # step time against the full head of the same C and process count
        full = next(r for r in rows if r["kind"] == "full" and r["processes"] == row["processes"])
        row["vs_full_step"] = row["step_s"] / full["step_s"] if full["classes"] == row["classes"] else None
        row["peak_vs_aim"] = max(row["peak_mib"]) / row["aim_mib"]
    table = Table(title=f"ArcFace head, D = {args.dim}, batch {args.batch} per process ({host['cpu']})")
    for column in ("head", "W", "C", "peak MiB / process", "aim MiB", "peak / aim", "+ grad MiB", "step s", "/ full"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            r["kind"] + (f" r={r['rate']:g}" if r["rate"] else ""),
            str(r["processes"]),
            f"{r['classes']:,}",
            " / ".join(f"{m:,.0f}" for m in r["peak_mib"]),
            f"{r['aim_mib']:,.0f}",
            f"{r['peak_vs_aim']:.2f}",
            f"{r['gradient_mib']:,.0f}",
            f"{r['step_s']:.2f}",
            f"{r['vs_full_step']:.3f}" if r["vs_full_step"] is not None else "-",
        )
    console.print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "host": host,
            "load_average": os.getloadavg(),
            "args": {k: str(v) for k, v in vars(args).items()},
            "rows": rows,
        }
        args.out.write_text(json.dumps(report, indent=1))
        console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
