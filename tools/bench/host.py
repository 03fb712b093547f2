"""Which CPU a benchmark ran on: its model name and cache sizes, for the reports.

A ratio against bare matmuls depends on the host, not only on the code: the margin heads
measured 1.12-1.22x three matmuls on a 2-core host whose effective last-level cache did not
hold a 20 MiB pass (matmuls 55-77 ms), and 1.04-1.11x on a 2-core AMD EPYC with a 32 MiB L3
(matmuls 105-120 ms), where the heads' 20 MiB passes stay in cache and the matmuls are slower.
Every report records the host so that figures from two runs are compared only when it is the
same.

Standard library only (``run.py`` must start without torch): ``/proc/cpuinfo`` and
``/sys/devices/system/cpu/cpu0/cache``, Linux's; elsewhere ``platform.processor()``.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (``/proc/cpuinfo``), or the platform's guess."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_caches() -> dict[str, str]:
    """``{"L1d": "32K", "L2": "1024K", "L3": "32768K", ...}`` for CPU 0, as sysfs lists them (empty if unknown)."""
    caches = {}
    for index in sorted(_CACHE_DIR.glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        name = f"L{level}" + {"Data": "d", "Instruction": "i"}.get(kind, "")
        caches[name] = size
    return caches


def describe_host() -> dict:
    """Model, logical CPUs usable by this process, and caches: what a benchmark report records."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu_model(), "cpus": usable, "caches": cpu_caches()}


def host_line(host: dict | None = None) -> str:
    """One line for a report's header, e.g. ``AMD EPYC, 2 CPUs, L2 1024K, L3 32768K``."""
    host = host or describe_host()
    caches = ", ".join(f"{k} {v}" for k, v in host["caches"].items() if k in ("L2", "L3"))
    return f"{host['cpu']}, {host['cpus']} CPUs" + (f", {caches}" if caches else "")
