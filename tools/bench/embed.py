"""Throughput of ``sslkit-embed`` on Fashion-MNIST test (10,000 images) against its backbone in a plain torch loop.

Three ways to the same (10,000 x D) normalised features, interleaved ``--repeats`` times so that load on
the machine hits all of them:

- ``plain loop``: the run's backbone and evaluation transform called on the test images in batches of
  ``--batch-size``, in this process, the features kept in a NumPy array (nothing written): the floor;
- ``sslkit-embed``: ``python -m sslkit.cli.embed RUN --data fashion_mnist --split test`` in a subprocess;
- ``sslkit-embed, 2 processes``: the same under ``accelerate launch --cpu --num_processes 2``.

The plain loop and the one-process command use ``--threads`` torch threads (default 1), the two processes
one each: on a 2-core machine shared with other work, two threads in one process wait on each other
(spin-waiting OpenMP threads) and vary several-fold from run to run, which would hide what is measured.

For the command two figures: the images/s of its encoding loop (it prints them: the chunks' rows over
their time, writing included) and the images/s of the whole command, start-up, dataset and weights
loading included (its wall time). The folder's rows are checked against the plain loop's.

Where the rows go across processes is measured too: each process writes its own rows into the shared
memory-mapped file (what sslkit-embed does; ``write`` is this process's time in those writes) against
gathering them to one process (two gloo processes gathering the same chunks; ``gather``).

    python tools/bench/embed.py --quick                      # a quick start-sized run on digits, seconds
    python tools/bench/embed.py --run runs/fashion-mnist-simclr --out embed_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host import describe_host, host_line  # noqa: E402

from sslkit import models  # noqa: E402
from sslkit.augment import EvalTransform  # noqa: E402
from sslkit.config import load_config  # noqa: E402
from sslkit.datasets import build_dataset  # noqa: E402
from sslkit.embeddings import read_embeddings  # noqa: E402

TRAIN = ["train.max_steps=2", "eval.linear_epochs=0", "eval.compare_random_init=false"]
TRAIN += ["eval.compare_raw_pixels=false"]


def train_run(recipe: str, folder: Path, extra: list[str]) -> Path:
    """Two optimizer steps of ``recipe``: a run directory with the recipe's backbone (throughput does not depend
    on the weights)."""
    from sslkit.loop import train

    train(load_config(recipe, [f"run.output_dir={folder}", "run.name=bench", *TRAIN, *extra]))
    return folder / "bench"


def plain_loop(run: Path, data: str, split: str, batch_size: int) -> tuple[float, np.ndarray]:
    """The backbone over the split in batches, as anyone would write it; seconds of the loop, and the features."""
    cfg = load_config(run / "config.yaml")
    dataset = build_dataset(data, split)
    backbone = models.backbone_from_config(cfg.model, dataset.info.channels).eval()
    backbone.load_state_dict(load_file(run / "backbone.safetensors"))
    transform = EvalTransform(cfg.augment.image_size, dataset.info.channels, dataset.info.mean, dataset.info.std)
    features = None
    start = time.perf_counter()
    with torch.no_grad():
        for first in range(0, len(dataset), batch_size):
            batch = F.normalize(backbone(transform(dataset.images[first : first + batch_size])), dim=1)
            if features is None:
                features = np.empty((len(dataset), batch.shape[1]), dtype=np.float32)
            features[first : first + len(batch)] = batch.numpy()
    return time.perf_counter() - start, features


def sslkit_embed(run: Path, out: Path, data: str, split: str, batch_size: int, processes: int, threads: int) -> dict:
    """The command in a subprocess (``threads`` torch threads; one per process for several); its loop's images/s
    (as it prints them) and its wall time."""
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "accelerate.commands.launch", "--quiet", "--cpu", "--num_processes", str(processes)]
        launcher += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    command = [*launcher, "-m", "sslkit.cli.embed", str(run), "--data", data, "--split", split]
    command += ["--batch-size", str(batch_size), "--out", str(out), "--overwrite"]
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    if processes == 1:
        env["OMP_NUM_THREADS"] = str(threads)
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    wall = time.perf_counter() - start
    if result.returncode:
        raise RuntimeError(f"{' '.join(command)} failed: {result.stderr[-2000:]}")
    loop = float(re.search(r"\(([\d,]+) images/s", result.stdout).group(1).replace(",", ""))
    return {"loop_images_per_s": loop, "wall_s": wall}


def write_seconds(run: Path, out: Path, data: str, split: str, batch_size: int) -> dict:
    """One process's encoding and writing time, from :func:`sslkit.embeddings.embed_to_folder` in this process."""
    from sslkit.embeddings import embed_to_folder

    _, report = embed_to_folder(run, out, data, split, batch_size=batch_size, overwrite=True, show_progress=False)
    return {"seconds": report["seconds"], "write_seconds": report["write_seconds"]}


def _gather_worker(rank: int, port: int, rows: int, dim: int, chunk_rows: int, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    chunks = [range(s, min(s + chunk_rows, rows)) for s in range(0, rows, chunk_rows)]
    # As sslkit-embed deals them: in round r this process has chunk 2r + rank (none past the last), sent padded.
    sends = [torch.randn(chunk_rows, dim) for _ in range(0, len(chunks), 2)]
    dist.barrier()
    start = time.perf_counter()
    for rows_here in sends:
        dist.all_gather([torch.empty(chunk_rows, dim) for _ in range(2)], rows_here)
    dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps({"gather_seconds": time.perf_counter() - start}))
    dist.destroy_process_group()


def gather_seconds(rows: int, dim: int, chunk_rows: int) -> float:
    """Seconds two gloo processes take to gather ``rows`` x ``dim`` float32 rows chunk by chunk (the alternative to
    each process writing its own rows)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "gather.json")
        mp.spawn(_gather_worker, args=(port, rows, dim, chunk_rows, out), nprocs=2, join=True)
        return json.loads(Path(out).read_text())["gather_seconds"]


def render(result: dict, console: Console) -> None:
    rows = result["rows"]
    title = f"{rows:,} images of {result['data']} {result['split']}, batch {result['batch_size']}"
    table = Table(title=f"{title}, {result['torch_threads']} thread(s) in one process, 1 each in two")
    for column in ("how", "loop images/s", "command images/s", "loop / plain loop"):
        table.add_column(column, justify="left" if column == "how" else "right")
    plain = rows / result["plain_s"]
    table.add_row("plain torch loop", f"{plain:,.0f}", "", "1.00")
    for key, name in (("one", "sslkit-embed"), ("two", "sslkit-embed, 2 processes")):
        loop, wall = result[key]["loop_images_per_s"], result[key]["wall_s"]
        table.add_row(name, f"{loop:,.0f}", f"{rows / wall:,.0f}", f"{loop / plain:.2f}")
    console.print(table)
    w = result["writes"]
    console.print(
        f"one process: {w['write_seconds']:.3f} s of {w['seconds']:.2f} s writing rows into the memory-mapped file; "
        f"gathering the same rows between 2 gloo processes instead: {result['gather_s']:.3f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", help="a run directory (default: train fashion_mnist_simclr for 2 steps)")
    parser.add_argument("--quick", action="store_true", help="a quick start-sized run on digits test (360 images)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the three, best of each kept")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads of the plain loop and of sslkit-embed in one process"
    )
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()

    data, split = ("digits", "test") if args.quick else ("fashion_mnist", "test")
    torch.set_num_threads(args.threads)
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        recipe, extra = ("quickstart", ["model.width=4"]) if args.quick else ("fashion_mnist_simclr", [])
        run = Path(args.run) if args.run else train_run(recipe, tmp / "runs", extra)
        timings = {"plain": [], "one": [], "two": []}
        for _ in range(args.repeats):
            seconds, features = plain_loop(run, data, split, args.batch_size)
            timings["plain"].append(seconds)
            timings["one"].append(sslkit_embed(run, tmp / "one", data, split, args.batch_size, 1, args.threads))
            timings["two"].append(sslkit_embed(run, tmp / "two", data, split, args.batch_size, 2, 1))
        for name in ("one", "two"):  # the command's rows are the plain loop's
            np.testing.assert_allclose(read_embeddings(tmp / name).vectors, features, atol=1e-5)
        writes = write_seconds(run, tmp / "writes", data, split, args.batch_size)
        chunk_rows = args.batch_size * 16
        result = {
            "run": str(run), "data": data, "split": split, "rows": len(features), "dim": features.shape[1],
            "batch_size": args.batch_size, "plain_s": min(timings["plain"]),
            "one": max(timings["one"], key=lambda t: t["loop_images_per_s"]),
            "two": max(timings["two"], key=lambda t: t["loop_images_per_s"]),
            "writes": writes, "gather_s": gather_seconds(len(features), features.shape[1], chunk_rows),
            "torch_threads": torch.get_num_threads(), "load_average_1min": os.getloadavg()[0],
            "host": describe_host(),
        }  # fmt: skip
    render(result, console)
    console.print(f"{host_line(result['host'])}; load average (1 min) {result['load_average_1min']:.1f}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
        console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
