"""How busy the CPUs were with other work while a timed run ran (``contention``).

The benchmarks time wall clock on machines shared with other work, so each
run records the fraction of all cores that other processes used meanwhile,
and a run above a limit can be retried. This module imports only the standard
library: ``bench_vllm``'s child loads it by path, before vLLM starts its workers
and without importing saspec (and so numba).
"""

from __future__ import annotations

import os
import time
from typing import Callable


def own_process_cpu_s() -> float:
    """CPU seconds (user + system) this process has used."""
    t = os.times()
    return t.user + t.system


def machine_busy_s() -> float | None:
    """CPU seconds all cores have spent busy since boot (``/proc/stat``); None where it is missing."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """The fraction of all cores' time other processes used between ``start()`` and ``stop()``.

    "Other" is the machine's busy time minus ``own_cpu_s()`` (default: this
    process's CPU seconds; pass a function that also counts child processes
    when the timed work runs in them). ``stop()`` returns a float in [0, 1],
    or None where ``/proc/stat`` is missing.
    """

    def __init__(self, own_cpu_s: Callable[[], float] = own_process_cpu_s) -> None:
        self.ncpu = os.cpu_count() or 1
        self._own_cpu_s = own_cpu_s
        self._start: tuple[float | None, float, float] | None = None

    def start(self) -> None:
        self._start = (machine_busy_s(), time.perf_counter(), self._own_cpu_s())

    def stop(self) -> float | None:
        busy, wall, own = machine_busy_s(), time.perf_counter(), self._own_cpu_s()
        if self._start is None:
            return None
        busy0, wall0, own0 = self._start
        if busy is None or busy0 is None:
            return None
        other = (busy - busy0) - (own - own0)
        return max(0.0, min(1.0, other / (self.ncpu * max(wall - wall0, 1e-9))))

    def wait_quiet(self, limit: float, max_wait_s: float = 60.0) -> None:
        """Sleep in 1 s slices until other processes use less than ``limit`` of the CPUs (or ``max_wait_s``)."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < max_wait_s:
            self.start()
            time.sleep(1.0)
            c = self.stop()
            if c is None or c < limit:
                return
