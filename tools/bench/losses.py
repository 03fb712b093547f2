"""CPU benchmark of sslkit's losses: every figure a ratio measured side by side in one run.

Not a test: it measures, it does not assert. Three sections, all float32, forward + backward:

(a) two-view / batch losses (NT-Xent, DCL, SupCon) at 2N = 1024, D = 128, against three bare
    (2N x D) @ (D x 2N) matmuls (the forward similarity matrix and its two backward products,
    the floor for any loss that needs every pair) and against lightly / pytorch-metric-learning;
(b) classification heads (ArcFace, CosFace, SphereFace, Proxy-NCA, Proxy-Anchor) at B = 512,
    D = 512, C = 10,000, against three bare (B x D) @ (D x C) matmuls and pytorch-metric-learning;
(c) every pairwise loss at 2N = 4096: time against the three matmuls and peak memory as a
    multiple of one (2N x 2N) fp32 matrix; and pytorch-metric-learning's NTXentLoss (which
    builds a (positives x negatives) matrix, O(N^3)) at the sizes it survives, next to sslkit's.

Timing: candidates of a row run interleaved (baseline, sslkit, peer, in a new random order each
repeat), and a figure is the median over repeats of the ratio of two candidates' times in the
same repeat: they ran milliseconds apart, so drift in the machine's speed cancels. In sections
(a) and (b) a candidate's time in a repeat is the time per call over a block of consecutive
calls about ``--block-ms`` long (25 ms: several calls of a batch loss, one of a head), as
``timeit`` does; ``--block-ms 0`` times single calls, which also counts waking the thread pool.

Memory (section c) runs in one subprocess whose allocations >= 64 KiB are mmap'ed
(``MALLOC_MMAP_THRESHOLD_``, which also stops glibc from keeping freed blocks resident; what
is left is handed back with ``malloc_trim`` before each measurement), with
an address-space cap (``RLIMIT_AS``) so a loss that tries to allocate O(N^3) fails with an
error instead of swapping the machine. Peak = Linux ``VmHWM`` after resetting it through
``/proc/self/clear_refs``, minus ``VmRSS`` just before the call: the peak resident memory the
forward + backward added (torch has no CPU allocator statistics; ``tracemalloc`` does not see
torch's allocations). Without ``clear_refs`` it falls back to a ``ru_maxrss`` delta, a lower
bound, and says so in the JSON.

sslkit losses are imported by module path; one that cannot be imported yet is printed as
"not available" and skipped, so the benchmark runs while the loss files are still landing.

Usage::

    python tools/bench/losses.py                 # full run, a few minutes on 2 cores
    python tools/bench/losses.py --quick         # tiny sizes, seconds (smoke test)
    python tools/bench/losses.py --out runs/bench/losses.json --threads 2
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import importlib
import json
import os
import platform
import random
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from host import describe_host, host_line  # tools/bench/host.py: this script's folder is on sys.path

# (name, module, class, call form). Call forms: "two_view" loss(z1, z2); "label"
# loss(embeddings, labels); "head" head(embeddings, labels), built with (embedding_dim, num_classes).
BATCH_LOSSES = [
    ("ntxent", "sslkit.losses.ntxent", "NTXentLoss", "two_view"),
    ("dcl", "sslkit.losses.dcl", "DCLLoss", "two_view"),
    ("supcon", "sslkit.losses.supcon", "SupConLoss", "label"),
]
HEADS = [
    ("arcface", "sslkit.losses.arcface", "ArcFaceHead", "head"),
    ("cosface", "sslkit.losses.cosface", "CosFaceHead", "head"),
    ("sphereface", "sslkit.losses.sphereface", "SphereFaceHead", "head"),
    ("proxy_nca", "sslkit.losses.proxy_nca", "ProxyNCAHead", "head"),
    ("proxy_anchor", "sslkit.losses.proxy_anchor", "ProxyAnchorHead", "head"),
]
PAIR_LOSSES = BATCH_LOSSES + [
    ("contrastive", "sslkit.losses.contrastive", "ContrastiveLoss", "label"),
    ("triplet", "sslkit.losses.triplet", "TripletLoss", "label"),
    ("lifted", "sslkit.losses.lifted", "LiftedStructureLoss", "label"),
    ("npair", "sslkit.losses.npair", "NPairLoss", "label"),
    ("angular", "sslkit.losses.angular", "AngularLoss", "label"),
    ("soft_nn", "sslkit.losses.soft_nn", "SoftNearestNeighborsLoss", "label"),
    ("circle", "sslkit.losses.circle", "CircleLoss", "label"),
]
SPECS = {name: (module, cls, form) for name, module, cls, form in PAIR_LOSSES + HEADS}

# Sections (a) and (b) time blocks of consecutive calls about this long (see median_times): a
# batch-loss step is a few ms, so its block is several calls; a head step (100+ ms) runs once.
SECTIONS = ("batch", "heads", "pairwise")  # (a), (b), (c) of the module docstring
BLOCK_MS = 25.0
BATCH_REPEAT_FACTOR = 10  # section (a) steps are short: this many times the repeats (see main)
HEAD_REPEAT_FACTOR = 3  # section (b): a 1.15x target wants a steadier median than 7 single calls give

TEMPERATURE = 0.1  # section (a): the same T for sslkit and the peer, so their values must agree

# Peers: name -> (label, factory(embedding_dim, num_classes), call form). Each library's own
# defaults elsewhere: a margin or scale does not change the amount of work.
PEERS: dict[str, tuple[str, Callable, str]] = {
    "ntxent": (
        "lightly NTXentLoss",
        lambda d, c: _peer("lightly.loss", "NTXentLoss", temperature=TEMPERATURE),
        "two_view",
    ),
    "dcl": ("lightly DCLLoss", lambda d, c: _peer("lightly.loss", "DCLLoss", temperature=TEMPERATURE), "two_view"),
    "supcon": (
        "pml SupConLoss",
        lambda d, c: _peer("pytorch_metric_learning.losses", "SupConLoss", temperature=TEMPERATURE),
        "label",
    ),
    "arcface": ("pml ArcFaceLoss", lambda d, c: _peer("pytorch_metric_learning.losses", "ArcFaceLoss", c, d), "label"),
    "cosface": ("pml CosFaceLoss", lambda d, c: _peer("pytorch_metric_learning.losses", "CosFaceLoss", c, d), "label"),
    "sphereface": (
        "pml SphereFaceLoss",
        lambda d, c: _peer("pytorch_metric_learning.losses", "SphereFaceLoss", c, d),
        "label",
    ),
    "proxy_nca": (
        "pml ProxyNCALoss",
        lambda d, c: _peer("pytorch_metric_learning.losses", "ProxyNCALoss", c, d, softmax_scale=9.0),
        "label",
    ),
    "proxy_anchor": (
        "pml ProxyAnchorLoss",
        lambda d, c: _peer("pytorch_metric_learning.losses", "ProxyAnchorLoss", c, d),
        "label",
    ),
}

FULL = {
    "batch": {"two_n": 1024, "dim": 128},
    "heads": {"batch": 512, "dim": 512, "classes": 10_000},
    "pairwise": {"two_n": 4096, "dim": 128},
    "pml_ntxent_sizes": [256, 512, 1024],
    "repeats": 7,
    "memory_cap_gb": 6.0,
    "timeout_s": 300,
}
QUICK = {
    "batch": {"two_n": 64, "dim": 16},
    "heads": {"batch": 32, "dim": 32, "classes": 200},
    "pairwise": {"two_n": 128, "dim": 16},
    "pml_ntxent_sizes": [32],
    "repeats": 2,
    "memory_cap_gb": 2.0,
    "timeout_s": 30,
}


def _peer(module: str, cls: str, *args, **kwargs):
    return getattr(importlib.import_module(module), cls)(*args, **kwargs)


def load_sslkit(name: str) -> type | str:
    """The sslkit class for ``name``, or a one-line reason it is not available yet."""
    module, cls, _ = SPECS[name]
    try:
        return getattr(importlib.import_module(module), cls)
    except Exception as exc:  # a half-written file may fail in any way; the row says how
        return f"not available ({type(exc).__name__}: {exc})".splitlines()[0][:160]


def build_sslkit(name: str, dim: int, classes: int | None = None, temperature: float | None = None):
    cls = load_sslkit(name)
    if isinstance(cls, str):
        return cls
    if SPECS[name][2] == "head":
        return cls(embedding_dim=dim, num_classes=classes)
    return cls(temperature=temperature) if temperature is not None else cls()


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


def make_step(loss, form: str, x: torch.Tensor, labels: torch.Tensor) -> Callable[[], float]:
    """One forward + backward of ``loss`` on leaf inputs; returns the loss value."""
    z1, z2 = (t.detach().clone().requires_grad_(True) for t in x.chunk(2))
    emb = x.detach().clone().requires_grad_(True)

    def step() -> float:
        if isinstance(loss, torch.nn.Module):
            loss.zero_grad(set_to_none=True)  # heads and pml's weighted losses own parameters
        if form == "two_view":
            z1.grad = z2.grad = None
            value = loss(z1, z2)
        else:
            emb.grad = None
            value = loss(emb, labels)
        value.backward()
        return value.item()

    return step


def make_matmul_step(m: int, k: int, n: int) -> Callable[[], float]:
    """The three matmuls of a differentiable (m x k) @ (k x n): forward, and both backward products."""
    a, b, grad = torch.randn(m, k), torch.randn(k, n), torch.randn(m, n)

    def step() -> float:
        a @ b  # (m, n) forward
        grad @ b.T  # (m, k) gradient of a
        a.T @ grad  # (k, n) gradient of b
        return 0.0

    return step


class Timings(dict):
    """Median seconds per candidate (the dict), with every repeat's time kept for paired ratios,
    and each candidate's page faults per call (``faults``)."""

    def __init__(self, samples: dict[str, list[float]], faults: dict[str, float] | None = None) -> None:
        super().__init__({name: statistics.median(t) for name, t in samples.items()})
        self.samples = samples
        self.faults = faults or {}

    def ratio(self, a: str, b: str) -> float | None:
        """Median over repeats of ``time[a] / time[b]`` within the same repeat.

        The two were timed a few milliseconds apart, so a change in the machine's speed during
        the run (other jobs, clock changes) cancels in each ratio; a ratio of the two medians
        would mix repeats taken minutes apart.
        """
        if a not in self.samples or b not in self.samples:
            return None
        return statistics.median(x / y for x, y in zip(self.samples[a], self.samples[b]))


def median_times(
    steps: dict[str, Callable], repeats: int, block_s: float = 0.0
) -> tuple[Timings, dict[str, float], dict[str, str]]:
    """Seconds per step, candidates interleaved in a fresh random order each repeat, and each
    step's value from its warm-up call.

    A random order keeps any candidate from always running just after the same other one
    (whose cache and memory state it would inherit). A step that raises is reported in the
    third dict, not timed.

    ``block_s > 0`` times each candidate, in each repeat, as a block of consecutive calls
    lasting about that long (the count fixed per candidate by a second, warm call, as
    ``timeit`` and ``torch.utils.benchmark`` do), and records the time per call. One call of a
    few milliseconds on its own also measures waking the thread pool and refilling the cache
    after the candidate before it; a training step calls the loss between the network's own
    parallel ops, which keep the threads awake. Steps longer than ``block_s`` run once.
    """
    errors: dict[str, str] = {}
    values: dict[str, float] = {}
    calls: dict[str, int] = {}
    for name, step in list(steps.items()):  # warm-up, and drop what fails
        try:
            values[name] = step()
            if block_s > 0:  # a second call, warm, sets the block's length
                start = time.perf_counter()
                step()
                calls[name] = max(1, round(block_s / max(time.perf_counter() - start, 1e-9)))
            else:
                calls[name] = 1
        except Exception as exc:
            errors[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
            del steps[name]
    samples: dict[str, list[float]] = {name: [] for name in steps}
    faults = dict.fromkeys(steps, 0)
    order = list(steps)
    shuffle = random.Random(0).shuffle
    for _ in range(repeats):
        shuffle(order)
        for name in order:
            faults_before = _minor_faults()
            start = time.perf_counter()
            for _ in range(calls[name]):
                steps[name]()
            samples[name].append((time.perf_counter() - start) / calls[name])
            faults[name] += _minor_faults() - faults_before
    total_calls = {name: repeats * calls[name] for name in steps}
    return Timings(samples, {name: faults[name] / total_calls[name] for name in steps}), values, errors


def _minor_faults() -> int:
    """This process's minor page faults so far: a fresh page of a new allocation is one.

    Reported per call beside each time, because on the CPU the C library's ``malloc`` may
    return a freed block of tens of MiB to the kernel and fault it back in on the next call:
    thousands of faults a call, a tenth of a head's time, and a swing in the matmul floor itself.
    """
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


# ---------------------------------------------------------------------------------------------
# Sections (a) and (b): in this process, timing only
# ---------------------------------------------------------------------------------------------


def against_the_floor(
    matmul3: Callable, ours: Callable, peer: Callable, repeats: int, block_s: float
) -> tuple[dict, dict]:
    """sslkit and the peer timed interleaved with the three matmuls: one row's figures.

    Returns the row's figures (ratios of paired times, raw medians in ms, errors) and each
    step's value from its warm-up call.
    """
    times, values, errors = median_times({"matmul3": matmul3, "sslkit": ours, "peer": peer}, repeats, block_s)
    figures = {
        "sslkit_over_matmul3": times.ratio("sslkit", "matmul3"),
        "peer_over_matmul3": times.ratio("peer", "matmul3"),
        "sslkit_over_peer": times.ratio("sslkit", "peer"),
        "raw_median_ms": {k: 1e3 * v for k, v in times.items()},
        "page_faults_per_call": {k: round(v, 1) for k, v in times.faults.items()},
    }
    return ({**figures, "errors": errors} if errors else figures), values


def measure_row(
    row_name: str,
    name: str,
    ours,
    form: str,
    x: torch.Tensor,
    labels: torch.Tensor,
    matmul_shape: tuple[int, int, int],
    classes: int | None,
    repeats: int,
    block_s: float,
) -> tuple[dict, dict | None]:
    """One row of section (a) or (b): sslkit's ``ours`` and loss ``name``'s peer against the matmuls.

    ``ours`` is a built loss or head, or the string saying why it is not available (the row
    then carries that note). Returns the row and each step's value from its warm-up call.
    """
    peer_label, peer_factory, peer_form = PEERS[name]
    row = {"loss": row_name, "peer": peer_label, "available": not isinstance(ours, str)}
    if isinstance(ours, str):
        return {**row, "note": ours}, None
    dim = x.shape[1]
    figures, values = against_the_floor(
        make_matmul_step(*matmul_shape),
        make_step(ours, form, x, labels),
        make_step(peer_factory(dim, classes), peer_form, x, labels),
        repeats,
        block_s,
    )
    return {**row, **figures}, values


def bench_batch_losses(sizes: dict, repeats: int, block_s: float = 0.0) -> list[dict]:
    two_n, dim = sizes["two_n"], sizes["dim"]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(two_n, dim, generator=g)
    # Two views of N images; for SupCon each image is its own class (the SimCLR case), so all
    # three losses see the same positives. SupCon runs a second time the way supervised training
    # feeds it: the N images drawn from 100 classes, about 10 positives per anchor.
    simclr_labels = torch.arange(two_n // 2).repeat(2)
    class_labels = torch.randint(0, 100, (two_n // 2,), generator=g).repeat(2)
    cases = [(name, name, form, simclr_labels) for name, _, _, form in BATCH_LOSSES]
    cases.append(("supcon, 100 classes", "supcon", "label", class_labels))
    rows = []
    for row_name, name, form, labels in cases:
        ours = build_sslkit(name, dim, temperature=TEMPERATURE)
        row, values = measure_row(row_name, name, ours, form, x, labels, (two_n, dim, two_n), None, repeats, block_s)
        if values is not None:
            row["abs_value_diff_vs_peer"] = (
                abs(values["sslkit"] - values["peer"]) if {"sslkit", "peer"} <= set(values) else None
            )
        rows.append(row)
    return rows


def bench_heads(sizes: dict, repeats: int, block_s: float = 0.0) -> list[dict]:
    batch, dim, classes = sizes["batch"], sizes["dim"], sizes["classes"]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, dim, generator=g)
    labels = torch.randint(0, classes, (batch,), generator=g)
    return [
        measure_row(
            name,
            name,
            build_sslkit(name, dim, classes),
            form,
            x,
            labels,
            (batch, dim, classes),
            classes,
            repeats,
            block_s,
        )[0]
        for name, _, _, form in HEADS
    ]


# ---------------------------------------------------------------------------------------------
# Section (c): a worker subprocess measures peak memory and time of each pairwise loss
# ---------------------------------------------------------------------------------------------


def _proc_status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # "5" resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def _release_freed_memory() -> None:
    """Hand memory freed by earlier measurements back to the OS, so this one starts from live memory only."""
    gc.collect()
    with contextlib.suppress(Exception):  # glibc only
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def measure_peak_bytes(step: Callable[[], float]) -> tuple[int, str]:
    """Peak resident bytes that one call of ``step`` adds on top of what is resident before it."""
    _release_freed_memory()
    if _reset_peak_rss():
        before = _proc_status_kb("VmRSS")
        step()
        return 1024 * (_proc_status_kb("VmHWM") - before), "VmHWM after /proc/self/clear_refs, minus VmRSS before"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    step()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return 1024 * (after - before), "ru_maxrss delta (a lower bound: earlier peaks hide part of it)"


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: int):
    def raise_timeout(signum, frame):
        raise _Timeout(f"took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, raise_timeout)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _pairwise_inputs(two_n: int, dim: int, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(two_n, dim, generator=torch.Generator().manual_seed(seed))
    return x, torch.arange(two_n // 2).repeat(2)  # two views per class: one positive per anchor


def _measure_loss(loss, form: str, two_n: int, dim: int, repeats: int, with_matmul: bool = True) -> dict:
    """Peak memory of the first full-size call (after a tiny warm-up), then interleaved timing."""
    small_x, small_labels = _pairwise_inputs(16, dim)
    make_step(loss, form, small_x, small_labels)()  # load kernels and thread pools outside the measurement
    x, labels = _pairwise_inputs(two_n, dim)
    step = make_step(loss, form, x, labels)
    peak, method = measure_peak_bytes(step)
    steps = {"loss": step}
    if with_matmul:
        steps["matmul3"] = make_matmul_step(two_n, dim, two_n)
    times, _, errors = median_times(steps, repeats)
    if errors:
        raise RuntimeError(errors["loss"])
    return {
        "peak_bytes": peak,
        "memory_method": method,
        "seconds": times["loss"],
        "matmul3_seconds": times.get("matmul3"),
        "over_matmul3": times.ratio("loss", "matmul3"),
    }


def _error(exc: BaseException, cap_gb: float) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
    if "alloc" in text.lower() or isinstance(exc, MemoryError):
        return f"out of memory under the {cap_gb:g} GB cap ({text})"
    return text


def worker(config: dict) -> None:
    """Runs in a subprocess: prints one ``RESULT {json}`` line per measurement as it finishes."""
    torch.set_num_threads(config["threads"])
    cap = int(config["memory_cap_gb"] * 2**30)
    # Cap the address space above what the imports already mapped, so an O(N^3) allocation
    # fails inside torch (RuntimeError) instead of pushing the machine into swap or the OOM killer.
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = 1024 * _proc_status_kb("VmSize") + cap
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    two_n, dim, repeats = config["two_n"], config["dim"], config["repeats"]

    def emit(record: dict) -> None:
        print("RESULT " + json.dumps(record), flush=True)

    for name in config["names"]:
        loss = build_sslkit(name, dim)
        if isinstance(loss, str):
            emit({"section": "pairwise", "loss": name, "available": False, "note": loss})
            continue
        try:
            with time_limit(config["timeout_s"]):
                m = _measure_loss(loss, SPECS[name][2], two_n, dim, repeats)
            emit({"section": "pairwise", "loss": name, "available": True, **m})
        except Exception as exc:
            emit(
                {"section": "pairwise", "loss": name, "available": True, "error": _error(exc, config["memory_cap_gb"])}
            )
        gc.collect()

    if not config["pml_sizes"]:
        return
    ours = build_sslkit("ntxent", dim, temperature=TEMPERATURE)
    theirs = _peer("pytorch_metric_learning.losses", "NTXentLoss", temperature=TEMPERATURE)
    for size in config["pml_sizes"]:
        record = {"section": "pml_ntxent", "two_n": size}
        # sslkit first: its peak is small, and measured after pml's gigabytes it would sit in
        # the noise of glibc handing those back.
        if not isinstance(ours, str):
            with time_limit(config["timeout_s"]):
                record["sslkit"] = _measure_loss(ours, "two_view", size, dim, config["pml_repeats"], with_matmul=False)
        try:
            with time_limit(config["timeout_s"]):
                pml = _measure_loss(theirs, "label", size, dim, config["pml_repeats"], with_matmul=False)
            record.update({"survived": True, "pml": pml})
        except Exception as exc:
            emit({**record, "survived": False, "error": _error(exc, config["memory_cap_gb"])})
            break  # larger sizes only need more
        emit(record)
        gc.collect()


def start_worker(config: dict) -> subprocess.Popen:
    """Start :func:`worker` in a fresh process whose large allocations are mmap'ed (see the module docstring)."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(1 << 16), OMP_NUM_THREADS=str(config["threads"]))
    return subprocess.Popen(
        [sys.executable, __file__, "--worker", json.dumps(config)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def collect_worker(config: dict, proc: subprocess.Popen) -> list[dict]:
    """Results of a started worker; if it dies (a crash, not an exception), restart it without that loss."""
    results: list[dict] = []
    names = list(config["names"])
    pml_sizes = list(config["pml_sizes"])
    while True:
        stdout, stderr = proc.communicate()
        got = [json.loads(line[len("RESULT ") :]) for line in stdout.splitlines() if line.startswith("RESULT ")]
        results += got
        done = {r["loss"] for r in got if r["section"] == "pairwise"}
        names = [n for n in names if n not in done]
        sizes_done = {r["two_n"] for r in got if r["section"] == "pml_ntxent"}
        if any(r["section"] == "pml_ntxent" and not r.get("survived") for r in got):
            pml_sizes = []
        else:
            pml_sizes = [s for s in pml_sizes if s not in sizes_done]
        if proc.returncode == 0 or (not names and not pml_sizes):
            return results
        reason = f"worker died (exit {proc.returncode}): {' '.join(stderr.strip().splitlines()[-1:])}"
        if names:
            results.append({"section": "pairwise", "loss": names[0], "available": True, "error": reason})
            names = names[1:]
        else:
            results.append({"section": "pml_ntxent", "two_n": pml_sizes[0], "survived": False, "error": reason})
            pml_sizes = []
        proc = start_worker({**config, "names": names, "pml_sizes": pml_sizes})


def pairwise_config(
    sizes: dict, pml_sizes: list[int], repeats: int, threads: int, cap_gb: float, timeout_s: int
) -> dict:
    return {
        "names": [name for name, *_ in PAIR_LOSSES],
        "pml_sizes": pml_sizes,
        "two_n": sizes["two_n"],
        # pml's NTXentLoss takes ~20 s a call at 2N = 512 on 2 cores: fewer repeats there.
        "dim": sizes["dim"],
        "repeats": repeats,
        "pml_repeats": min(repeats, 3),
        "threads": threads,
        "memory_cap_gb": cap_gb,
        "timeout_s": timeout_s,
    }


def pairwise_rows(config: dict, results: list[dict]) -> tuple[list[dict], list[dict]]:
    two_n = config["two_n"]
    matrix = 4 * two_n * two_n  # bytes of one (2N, 2N) fp32 matrix
    rows = []
    for r in (r for r in results if r["section"] == "pairwise"):
        row = {"loss": r["loss"], "available": r["available"]}
        if "note" in r or "error" in r:
            rows.append({**row, "note": r.get("note") or r.get("error")})
            continue
        rows.append(
            {
                **row,
                "over_matmul3": r.get("over_matmul3", ratio(r["seconds"], r["matmul3_seconds"])),
                "peak_over_matrix": max(r["peak_bytes"], 0) / matrix,
                "memory_method": r["memory_method"],
                "raw": {
                    "seconds": r["seconds"],
                    "matmul3_seconds": r["matmul3_seconds"],
                    "peak_bytes": r["peak_bytes"],
                },
            }
        )
    pml_rows = []
    for r in (r for r in results if r["section"] == "pml_ntxent"):
        n = r["two_n"]
        row = {"two_n": n, "survived": r["survived"]}
        if not r["survived"]:
            pml_rows.append({**row, "note": r["error"]})
            continue
        pml, ours = r["pml"], r.get("sslkit")
        pml_rows.append(
            {
                **row,
                "pml_peak_over_matrix": max(pml["peak_bytes"], 0) / (4 * n * n),
                "sslkit_peak_over_matrix": max(ours["peak_bytes"], 0) / (4 * n * n) if ours else None,
                "pml_over_sslkit_time": ratio(pml["seconds"], ours["seconds"]) if ours else None,
                # a peak under 256 KiB is below what RSS resolves reliably: no ratio from it
                "pml_over_sslkit_peak": ratio(pml["peak_bytes"], ours["peak_bytes"])
                if ours and ours["peak_bytes"] > 2**18
                else None,
                "raw": {"pml": pml, "sslkit": ours},
            }
        )
    return rows, pml_rows


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def _short(note: str) -> str:
    """A table cell's reason without its details (the JSON keeps them)."""
    return note.split(" (")[0]


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}x"


def print_report(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 132))  # piped output would wrap at 80
    meta = report["meta"]
    console.print(
        f"[bold]sslkit loss benchmark[/bold]: torch {meta['torch']}, {meta['threads']} threads "
        f"(torch.set_num_threads), float32 forward+backward, medians over "
        f"{meta.get('batch_repeats', meta['repeats'])} (a) / {meta.get('head_repeats', meta['repeats'])} (b) / "
        f"{meta['repeats']} (c) interleaved repeats"
        f", blocks of {meta.get('block_ms', 0):g} ms (a, b)"
        + (" [yellow](--quick sizes)[/yellow]" if meta["quick"] else "")
    )
    if "host" in meta:  # a ratio depends on the host (see host.py): compare runs on the same one
        console.print(f"host: {host_line(meta['host'])}", markup=False, highlight=False)
    s = meta["sizes"]
    for key, title, rows in (
        (
            "batch",
            f"(a) batch losses, 2N={s['batch']['two_n']}, D={s['batch']['dim']}, T={TEMPERATURE}",
            report["batch_losses"],
        ),
        (
            "heads",
            f"(b) heads, B={s['heads']['batch']}, D={s['heads']['dim']}, C={s['heads']['classes']:,}",
            report["heads"],
        ),
    ):
        if not rows:
            continue
        table = Table(title=title, title_justify="left")
        for col in (
            "loss",
            "sslkit / 3 matmuls",
            "peer",
            "peer / 3 matmuls",
            "sslkit / peer",
            "page faults / call: sslkit, 3 matmuls, peer",
        ):
            table.add_column(col, justify="left" if col in ("loss", "peer") else "right")
        if key == "batch":
            table.add_column("|value diff|", justify="right")
        for r in rows:
            if not r["available"]:
                table.add_row(r["loss"], _short(r["note"]), r["peer"], "", "", "", *([""] if key == "batch" else []))
                continue
            diff = r.get("abs_value_diff_vs_peer")
            extra = ["-" if diff is None else f"{diff:.1e}"] if key == "batch" else []
            faults = r.get("page_faults_per_call", {})
            fault_text = ", ".join(f"{faults[k]:.0f}" if k in faults else "-" for k in ("sslkit", "matmul3", "peer"))
            table.add_row(
                r["loss"],
                _fmt(r["sslkit_over_matmul3"]),
                r["peer"],
                _fmt(r["peer_over_matmul3"]),
                _fmt(r["sslkit_over_peer"]),
                fault_text,
                *extra,
            )
        console.print(table)

    if not report["pairwise"] and not report["pml_ntxent"]:
        return
    two_n = s["pairwise"]["two_n"]
    table = Table(title=f"(c) pairwise losses, 2N={two_n}, D={s['pairwise']['dim']}", title_justify="left")
    for col in ("loss", "time / 3 matmuls", f"peak / one 2N x 2N fp32 matrix ({4 * two_n**2 / 2**20:.2g} MiB)"):
        table.add_column(col, justify="left" if col == "loss" else "right")
    for r in report["pairwise"]:
        if "note" in r:
            table.add_row(r["loss"], _short(r["note"]), "")
        else:
            table.add_row(r["loss"], _fmt(r["over_matmul3"]), _fmt(r["peak_over_matrix"], 1))
    console.print(table)

    table = Table(title="(c') pml NTXentLoss and sslkit NTXentLoss at the sizes pml survives", title_justify="left")
    for col in ("2N", "pml peak / matrix", "sslkit peak / matrix", "pml / sslkit peak", "pml / sslkit time"):
        table.add_column(col, justify="right")
    for r in report["pml_ntxent"]:
        if not r["survived"]:
            table.add_row(str(r["two_n"]), _short(r["note"]), "", "", "")
        else:
            table.add_row(
                str(r["two_n"]),
                _fmt(r["pml_peak_over_matrix"], 1),
                _fmt(r["sslkit_peak_over_matrix"], 1),
                _fmt(r["pml_over_sslkit_peak"], 1),
                _fmt(r["pml_over_sslkit_time"], 1),
            )
    console.print(table)
    console.print(f"memory: {meta['memory_method']}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench/losses.json"), help="JSON report path")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run in seconds")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch.set_num_threads")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per candidate (median)")
    parser.add_argument(
        "--block-ms",
        type=float,
        default=BLOCK_MS,
        help="time sections (a) and (b) in blocks of consecutive calls this long (0: one call per repeat)",
    )
    parser.add_argument(
        "--only",
        choices=SECTIONS,
        action="append",
        help="run only this section (repeatable): batch (a), heads (b), pairwise (c); default all",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return {}

    config = dict(QUICK if args.quick else FULL)
    repeats = args.repeats or config["repeats"]
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    started = time.perf_counter()
    worker_config = pairwise_config(
        config["pairwise"],
        config["pml_ntxent_sizes"],
        repeats,
        args.threads,
        config["memory_cap_gb"],
        config["timeout_s"],
    )
    # --quick only checks that everything runs, so its memory worker overlaps sections (a) and
    # (b); a full run keeps them apart so that no measurement competes with another for the CPU.
    sections = set(args.only or SECTIONS)
    early = start_worker(worker_config) if args.quick and "pairwise" in sections else None
    # A batch-loss step takes 3-10 ms against 100+ ms for a head: ten times the repeats gives
    # both sections about the same measuring time, and one noisy millisecond less weight.
    batch_repeats = BATCH_REPEAT_FACTOR * repeats
    # A head step is one call per repeat (100+ ms, longer than a block): three times the repeats
    # (about 35 s at full size) so that the ratio's median moves less with the host's jitter.
    head_repeats = HEAD_REPEAT_FACTOR * repeats
    block_s = args.block_ms / 1e3
    batch_rows = bench_batch_losses(config["batch"], batch_repeats, block_s) if "batch" in sections else []
    head_rows = bench_heads(config["heads"], head_repeats, block_s) if "heads" in sections else []
    pair_rows, pml_rows = [], []
    if "pairwise" in sections:
        results = collect_worker(worker_config, early or start_worker(worker_config))
        pair_rows, pml_rows = pairwise_rows(worker_config, results)
    methods = {r["memory_method"] for r in pair_rows if "memory_method" in r}
    report = {
        "meta": {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "host": describe_host(),
            "threads": torch.get_num_threads(),
            "repeats": repeats,
            "batch_repeats": batch_repeats,
            "head_repeats": head_repeats,
            "quick": args.quick,
            "sections": sorted(sections),
            "dtype": "float32",
            "timing": "median of interleaved repeats of forward+backward, after one warm-up call",
            "block_ms": args.block_ms,
            "memory_method": "; ".join(sorted(methods)) or "not measured",
            "memory_cap_gb": config["memory_cap_gb"],
            "sizes": {k: config[k] for k in ("batch", "heads", "pairwise", "pml_ntxent_sizes")},
            "seconds": time.perf_counter() - started,
        },
        "batch_losses": batch_rows,
        "heads": head_rows,
        "pairwise": pair_rows,
        "pml_ntxent": pml_rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print_report(report)
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
