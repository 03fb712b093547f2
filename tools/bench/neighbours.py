"""Time and peak memory of nearest neighbours and near-duplicates over embeddings files.

Every case reads its vectors memory-mapped from an embeddings folder written once per size
(``--data``), as ``sslkit-neighbours`` and ``sslkit-duplicates`` do, and runs in a fresh process:
wall time, and peak memory as the process's peak RSS less its RSS before the call (the file's
pages count once they are read).

The vectors: ``clusters`` Gaussian clusters on the unit sphere, each point its cluster's unit
centre plus Gaussian noise of norm about ``--noise`` (0.7: a point's similarity to its centre is
about 0.82, to another point of its cluster about 0.67), L2-normalised. For ``dedup``,
``--copies`` of the rows are replaced by near-copies of other rows (noise of norm 0.05:
similarity about 0.999), which SemDeDup should find.

Cases:

- ``exact``: :func:`sslkit.embeddings.nearest_neighbours`, every item's k nearest, exact (60,000 x 512);
- ``exact-sample``: the exact k nearest of ``--sample`` queries among all N; the time of all N
  queries is N / sample times its search (reading the vectors aside): the search is linear in the queries;
- ``ivf``, ``hnsw``: the faiss index built, then the k nearest of ``--queries`` random items
  searched (the time of all N queries is N / queries times it), timed apart; recall@k against the
  exact search on ``--sample`` of those queries; ``ivf`` at several ``--nprobe`` and ``hnsw`` at
  several ``--ef-search`` on the same index;
- ``dedup``: :func:`sslkit.embeddings.semdedup` at ``--threshold`` with each k-means
  (``--kmeans``), and the share of the injected copies found;
- ``floor``: the exact k nearest of every row of ``--n`` random unit vectors (Gaussian, L2-normalised)
  among all of them, timed three ways on the same threads, interleaved over ``--rounds`` rounds (the
  median of each): sslkit's :func:`sslkit.evaluation.search.exact_search` (a row left out of its own
  list); its *floor*, the same blocks' matrix products alone (the same rows per block, columns per
  block and tiles, into the same buffer, by the same :func:`~sslkit.evaluation.search.similarity_tiles`,
  nothing selected); and faiss' exact ``IndexFlatIP`` (k + 1 searched: a row finds itself), if faiss
  is installed. Wall and CPU time (this process) of each; prints floor / sslkit (the share of the
  floor's speed sslkit reaches) and faiss / sslkit (above 1: sslkit is faster), and how many neighbour
  lists faiss and sslkit agree on.

    python tools/bench/neighbours.py --quick
    python tools/bench/neighbours.py --cases exact --n 60000 --dim 512 --clusters 10
    python tools/bench/neighbours.py --cases exact-sample ivf hnsw --n 1000000 --dim 128 --clusters 1000
    python tools/bench/neighbours.py --cases dedup --n 1000000 --dim 128 --clusters 1000
    python tools/bench/neighbours.py --cases floor --n 100000 --dim 128 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host import describe_host, host_line  # noqa: E402

CASES = ("exact", "exact-sample", "ivf", "hnsw", "dedup", "floor")
QUICK = {
    "n": 20_000,
    "dim": 64,
    "clusters": 20,
    "sample": 200,
    "queries": 5000,
    "nprobe": [8, 16],
    "ef_search": [32, 64],
}
COPY_NOISE = 0.05


def rss_bytes() -> int:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def sphere_clusters(n: int, dim: int, clusters: int, noise: float, copies: int, seed: int = 0) -> np.ndarray:
    """Shape: returns (n, dim) float32, rows L2-normalised; the last ``copies`` rows near-copies of random rows."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    vectors = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 100_000):  # float32 chunks: 1,000,000 x 256 needs 1 GB, not 2 GB of float64
        stop = min(start + 100_000, n)
        noise_rows = rng.standard_normal((stop - start, dim), dtype=np.float32) * (noise / np.sqrt(dim))
        vectors[start:stop] = centres[rng.integers(0, clusters, stop - start)] + noise_rows
    if copies:
        sources = rng.choice(n - copies, copies, replace=False)
        jitter = rng.standard_normal((copies, dim), dtype=np.float32) * (COPY_NOISE / np.sqrt(dim))
        vectors[n - copies :] = vectors[sources] + jitter
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


def data_folder(root: Path, n: int, dim: int, clusters: int, noise: float, copies: int) -> Path:
    """The embeddings folder of these vectors, written on first use."""
    from sslkit.embeddings import write_embeddings

    folder = root / f"sphere-{n}x{dim}-c{clusters}-noise{noise}-copies{copies}"
    if not (folder / "meta.json").is_file():
        vectors = sphere_clusters(n, dim, clusters, noise, copies)
        write_embeddings(folder, vectors, [str(i) for i in range(n)], meta={"copies": copies})
    return folder


def timed(call):
    baseline, start = rss_bytes(), time.perf_counter()
    result = call()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    return result, seconds, (peak - baseline) / 2**20


def exact_sample(vectors, k: int, sample: int, seed: int = 0):
    """The exact k nearest of ``sample`` random rows among all of ``vectors`` (themselves left out), and the
    seconds the search took (reading the vectors aside)."""
    from sslkit.embeddings.neighbours import exact_search, unit_vectors

    rows = np.sort(np.random.default_rng(seed).permutation(len(vectors))[:sample])
    references = unit_vectors(vectors)
    start = time.perf_counter()
    indices = exact_search(references, references[rows], k, torch.from_numpy(rows))[1]
    return rows, indices, time.perf_counter() - start


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(np.intersect1d(a, b)) for a, b in zip(found, exact)]) / exact.shape[1])


def random_unit_vectors(n: int, dim: int, seed: int = 0) -> torch.Tensor:
    """Shape: returns (n, dim) float32, Gaussian rows L2-normalised."""
    generator = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, dim, generator=generator), dim=1)


def matrix_product_floor(vectors: torch.Tensor, k: int) -> None:
    """What :func:`~sslkit.evaluation.search.exact_search` of every row among ``vectors`` computes, without
    choosing anything: its blocks of rows and columns on its threads, each block a tile at a time into its
    buffer, as it lays them out on the CPU."""
    from sslkit.evaluation import search

    rows = min(search.SEARCH_ROWS, len(vectors))

    def products(searcher: search.BlockSearch, start: int, stop: int) -> None:
        block = search.unit_rows(vectors[start:stop])
        for _, part, _, tile in searcher.parts:
            searcher.products(block, part, None, tile)

    search.over_query_blocks(
        len(vectors), rows, lambda threads: search.BlockSearch(vectors, k, rows, threads), products
    )


def measure_floor(n: int, dim: int, k: int, rounds: int) -> dict:
    """sslkit's exact search of every row, its matrix-product floor and faiss' exact index, interleaved."""
    from sslkit.evaluation.search import exact_search, faiss_installed

    vectors = random_unit_vectors(n, dim)
    calls = {
        "sslkit": lambda: exact_search(vectors, vectors, k, torch.arange(n)),
        "floor": lambda: matrix_product_floor(vectors, k),
    }
    if faiss_installed():
        import faiss

        faiss.omp_set_num_threads(torch.get_num_threads())
        index = faiss.IndexFlatIP(dim)
        index.add(vectors.numpy())
        calls["faiss"] = lambda: index.search(vectors.numpy(), k + 1)
    wall, cpu, found = {name: [] for name in calls}, {name: [] for name in calls}, {}
    for _ in range(rounds):
        for name, call in calls.items():
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            found[name] = call()
            wall[name].append(time.perf_counter() - start_wall)
            cpu[name].append(time.process_time() - start_cpu)
    result = {
        "wall_seconds": {name: float(np.median(times)) for name, times in wall.items()},
        "cpu_seconds": {name: float(np.median(times)) for name, times in cpu.items()},
        "all_wall_seconds": wall,
    }
    if "faiss" in found:
        # faiss lists a row first among its own neighbours (ties aside); drop it as sslkit leaves it out.
        faiss_lists = found["faiss"][1]
        own = faiss_lists == np.arange(n)[:, None]
        own[~own.any(axis=1), -1] = True
        faiss_lists = faiss_lists[~own].reshape(n, k)
        result["same_lists"] = float((faiss_lists == found["sslkit"][1].numpy()).all(axis=1).mean())
    return result


def measure(
    case: str, folder: str, k: int, sample: int, queries: int, settings: list[int], threshold: float, kmeans: str
) -> dict:
    """One case, in this process (the parent starts a fresh one for each)."""
    from sslkit.embeddings import read_embeddings, semdedup
    from sslkit.embeddings.neighbours import (
        build_faiss_index,
        exact_search,
        faiss_search,
        nearest_neighbours,
        unit_vectors,
    )

    embeddings = read_embeddings(folder)
    vectors = embeddings.vectors
    if case == "exact":
        _, seconds, peak = timed(lambda: nearest_neighbours(vectors, k))
        return {"seconds": seconds, "peak_mib": peak}
    if case == "exact-sample":
        (_, _, search), seconds, peak = timed(lambda: exact_sample(vectors, k, sample))
        return {"seconds": seconds, "peak_mib": peak, "all_queries_seconds": search * len(vectors) / sample}
    if case == "dedup":
        found, seconds, peak = timed(lambda: semdedup(vectors, threshold, kmeans=kmeans))
        copies = int(embeddings.meta.get("copies", 0))
        injected = np.arange(len(vectors) - copies, len(vectors))
        # An injected copy is found when it shares a group with anything (its source, as a rule).
        in_groups = np.zeros(len(vectors), dtype=bool)
        for rows in found.groups():
            in_groups[rows] = True
        return {
            "seconds": seconds, "peak_mib": peak, "kmeans": found.kmeans, "duplicates": found.num_duplicates,
            "clusters": int(found.clusters.max()) + 1, "copies_found": float(in_groups[injected].mean()),
        }  # fmt: skip
    references = unit_vectors(vectors)
    baseline = rss_bytes()
    start = time.perf_counter()
    index = build_faiss_index(references.numpy(), case, settings[0], settings[0], seed=0)
    build = time.perf_counter() - start
    rows = np.random.default_rng(0).permutation(len(vectors))[:queries]  # the first `sample` are the recall's
    found = {}
    for setting in settings:
        if case == "ivf":
            index.nprobe = setting
        else:
            index.hnsw.efSearch = setting
        start = time.perf_counter()
        found[setting] = (faiss_search(index, references[rows], k, rows)[1], time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # before the exact search of the sample
    del index
    recall_rows = np.sort(rows[:sample])
    exact = exact_search(references, references[recall_rows], k, torch.from_numpy(recall_rows))[1]
    position = np.argsort(rows)[np.searchsorted(np.sort(rows), recall_rows)]  # where each recall row was asked
    results = [{"setting": setting, "query_seconds": seconds * len(vectors) / len(rows),
                "recall": recall(indices[position], exact)}
               for setting, (indices, seconds) in found.items()]  # fmt: skip
    return {"build_seconds": build, "peak_mib": (peak - baseline) / 2**20, "queries_timed": len(rows),
            "by_setting": results}  # fmt: skip


def measure_in_fresh_process(case: str, folder: Path | None, args, settings: list[int]) -> dict:
    if case == "floor":
        spec = {"floor": {"n": args.n, "dim": args.dim, "k": args.k, "rounds": args.rounds}}
    else:
        spec = {"case": case, "folder": str(folder), "k": args.k, "sample": args.sample, "queries": args.queries,
                "settings": settings,
                "threshold": args.threshold, "kmeans": args.kmeans_backend}  # fmt: skip
    command = [sys.executable, __file__, "--measure", json.dumps(spec)]
    if args.threads:
        command += ["--threads", str(args.threads)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def render_floor(row: dict, console: Console) -> None:
    """The exact search against its matrix-product floor and faiss' exact index: times and ratios."""
    wall, cpu = row["wall_seconds"], row["cpu_seconds"]
    table = Table(title=f"Exact search of every row of {row['n']:,} x {row['dim']}, k = {row['k']}: median of "
                        f"{row['rounds']} rounds, {row['threads']} thread(s), {row['host']}")  # fmt: skip
    for column in ("", "wall s", "CPU s", "floor / this (wall)", "floor / this (CPU)"):
        table.add_column(column, justify="left" if not column else "right")
    for name in wall:
        ratios = [f"{times['floor'] / times[name]:.3f}" for times in (wall, cpu)]
        table.add_row(name, f"{wall[name]:.2f}", f"{cpu[name]:.2f}", *ratios)
    console.print(table)
    floor_ratios = f"{wall['floor'] / wall['sslkit']:.3f} (wall), {cpu['floor'] / cpu['sslkit']:.3f} (CPU)"
    console.print(f"exact search / matrix-product floor: floor / sslkit = {floor_ratios}")
    if "faiss" in wall:
        console.print(f"faiss exact / sslkit exact: faiss / sslkit = {wall['faiss'] / wall['sslkit']:.3f} (wall), "
                      f"{cpu['faiss'] / cpu['sslkit']:.3f} (CPU); the same {row['k']} neighbours in order for "
                      f"{row['same_lists']:.4%} of the rows")  # fmt: skip
    else:
        console.print("faiss exact: not measured, faiss is not installed (pip install faiss-cpu)")


def render(rows: list[dict], console: Console) -> None:
    rows = [row for row in rows if row["case"] != "floor"]
    if not rows:
        return
    table = Table(title="Neighbours and duplicates: wall time and peak memory (RSS above the start)")
    for column in ("case", "N x D", "setting", "build s", "search s", "peak MiB", "recall@k / found", "note"):
        table.add_column(column, justify="left" if column in ("case", "note") else "right")
    for row in rows:
        size = f"{row['n']:,} x {row['dim']}"
        if "error" in row:
            table.add_row(row["case"], size, "", "", "", "", "", f"error: {row['error']}")
        elif "by_setting" in row:
            name = "nprobe" if row["case"] == "ivf" else "efSearch"
            note = f"search: all N queries, from {row['queries_timed']:,}"
            for entry in row["by_setting"]:
                cells = [f"{name} {entry['setting']}", f"{row['build_seconds']:.1f}", f"{entry['query_seconds']:.1f}"]
                table.add_row(row["case"], size, *cells, f"{row['peak_mib']:.0f}", f"{entry['recall']:.4f}", note)
        elif row["case"] == "dedup":
            note = f"{row['duplicates']:,} duplicates, {row['clusters']:,} clusters"
            cells = [f"k-means {row['kmeans']}", "", f"{row['seconds']:.1f}", f"{row['peak_mib']:.0f}"]
            table.add_row(row["case"], size, *cells, f"{row['copies_found']:.4f}", note)
        else:
            note = f"all N queries: {row['all_queries_seconds']:.0f} s" if "all_queries_seconds" in row else ""
            table.add_row(row["case"], size, "", "", f"{row['seconds']:.1f}", f"{row['peak_mib']:.0f}", "", note)
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"small sizes, every case: {QUICK}")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=["exact"])
    parser.add_argument("--n", type=int, default=60_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--clusters", type=int, default=10)
    parser.add_argument("--noise", type=float, default=0.7)
    parser.add_argument("--copies", type=int, default=0, help="near-copies injected (dedup; default N / 100)")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--sample", type=int, default=1000, help="queries the recall is measured on")
    parser.add_argument("--queries", type=int, default=100_000, help="queries a faiss index is timed on")
    parser.add_argument("--nprobe", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--ef-search", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--threshold", type=float, default=0.99)
    parser.add_argument("--rounds", type=int, default=3, help="floor: interleaved rounds, the median reported")
    parser.add_argument("--kmeans", nargs="+", default=["faiss", "torch"], dest="kmeans_backends")
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "sslkit-bench-neighbours"))
    parser.add_argument("--threads", type=int, help="torch threads (default: every core)")
    parser.add_argument("--out", help="write the figures as JSON here")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # internal: one measurement, as JSON
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.measure:
        spec = json.loads(args.measure)
        print(json.dumps(measure_floor(**spec["floor"]) if "floor" in spec else measure(**spec)))
        return
    if args.quick:
        args.cases = list(CASES)
        for key, value in QUICK.items():
            setattr(args, key, value)

    console = Console(width=140)
    load_before = os.getloadavg()[0]
    rows = []
    for case in args.cases:
        copies = (args.copies or args.n // 100) if case == "dedup" else 0
        folder = (
            None
            if case == "floor"
            else data_folder(Path(args.data), args.n, args.dim, args.clusters, args.noise, copies)
        )
        settings = {"ivf": args.nprobe, "hnsw": args.ef_search}.get(case, [0])
        for backend in args.kmeans_backends if case == "dedup" else [None]:
            args.kmeans_backend = backend
            row = {"case": case, "n": args.n, "dim": args.dim, "clusters": args.clusters, "noise": args.noise,
                   "copies": copies, "k": args.k, "sample": args.sample}  # fmt: skip
            row.update(measure_in_fresh_process(case, folder, args, settings))
            if case == "floor":
                row.update({"rounds": args.rounds, "threads": torch.get_num_threads(), "host": host_line()})
            console.print(row)
            rows.append(row)
    render(rows, console)
    for row in rows:
        if row["case"] == "floor" and "error" not in row:
            render_floor(row, console)
    machine = {
        **describe_host(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "python": platform.python_version(), "load_average_1min": [load_before, os.getloadavg()[0]],
    }  # fmt: skip
    console.print(f"load average (1 min) before / after {load_before:.1f} / {machine['load_average_1min'][1]:.1f}")
    if args.out:
        with open(args.out, "w") as file:
            json.dump({"rows": rows, "machine": machine}, file, indent=2)
        console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
