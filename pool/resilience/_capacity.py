"""The resource cap: how many predicts this host can carry at once (seed 004).

Each in-flight predict holds a pooled connection: a few threads, a socket or two and
some memory. The cap is the smallest of what CPU, available memory and the open-file
limit allow, so a window can never grow past what this machine can carry even when
the Space could take more. It is computed once, when the pool starts.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

_PER_CPU = 32  # predicts are I/O waits: many per core
_MEM_PER_CALL = 16 * 1024 * 1024  # bytes: a Client, its threads and a result
_FDS_PER_CALL = 4  # the job's HTTP stream, the result stream, spare
_FD_RESERVE = 64  # the process's own files, the coordinator, logs


@dataclass(frozen=True)
class ResourceCap:
    cpu: int
    memory: int
    files: int

    @property
    def cap(self) -> int:
        return max(1, min(self.cpu, self.memory, self.files))


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _open_files() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def resource_cap() -> ResourceCap:
    """This host's cap, from CPU count, MemAvailable and RLIMIT_NOFILE."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpu = (cpus or 1) * _PER_CPU
    mem = _available_memory()
    memory = mem // _MEM_PER_CALL if mem is not None else cpu
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        files = cpu
    else:
        files = max(1, (soft - _open_files() - _FD_RESERVE) // _FDS_PER_CALL)
    return ResourceCap(cpu=cpu, memory=max(1, memory), files=files)
