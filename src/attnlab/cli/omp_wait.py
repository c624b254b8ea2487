"""Imported for its effect, before torch: how idle OpenMP threads wait, chosen from how busy the machine is.

PyTorch's CPU kernels run on OpenMP threads, which wait for the next parallel region spinning (``ACTIVE``)
or asleep (``PASSIVE``). On an idle machine spinning wins: a two-thread training step of nanoGPT's
configuration took 36-38 ms spinning, 43-48 ms with libgomp's default (spin a little, then sleep) and
51-60 ms asleep (AMD EPYC, 2 cores; issue 6). On a machine whose cores other processes are using, a
spinning thread takes the core another thread of the same step needs: 1.3x to 25x slower than asleep.

So the language-model commands look at the CPUs they may run on for a tenth of a second before torch loads
(``/proc/stat``'s per-CPU lines; a cpuset or ``taskset`` leaves the others out): when other processes keep less
than :data:`IDLE_CORES` of a core busy they spin, else they sleep, as they also do where ``/proc/stat`` cannot
be read. The variable is read once, when the OpenMP runtime loads with torch, so this module must be imported
before torch is; a value the user set is kept (``OMP_WAIT_POLICY=PASSIVE`` on a machine that will be shared
later, ``ACTIVE`` to always spin).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection

from attnlab.cli.params import own_cpus

#: Other processes using less than this many cores count as an idle machine.
IDLE_CORES = 0.25
#: How long the machine is watched.
INTERVAL = 0.1


def cpu_times(stat: str, cpus: Collection[int]) -> tuple[int, int, int]:
    """(busy, total) clock ticks of the CPUs ``cpus`` from the text of ``/proc/stat``, and how many CPUs they are.

    Their ``cpuN`` lines, or where some have none the first, ``cpu`` line of all the file's CPUs: a container
    whose ``/proc/stat`` is its own (LXCFS) numbers its CPUs from 0, not as the host's affinity does."""
    rows, summary = {}, None
    for line in stat.splitlines():
        name, _, values = line.partition(" ")
        if name == "cpu":
            summary = [int(v) for v in values.split()]
        elif name.startswith("cpu") and name[3:].isdigit():
            rows[int(name[3:])] = [int(v) for v in values.split()]
    if all(cpu in rows for cpu in cpus):
        chosen, count = [rows[cpu] for cpu in cpus], len(cpus)
    elif summary is not None and rows:
        chosen, count = [summary], len(rows)
    else:
        raise ValueError("/proc/stat has no line for these CPUs")
    busy = total = 0
    for fields in chosen:
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
        whole = sum(fields[:8])  # guest time is counted inside user time already
        busy, total = busy + whole - idle, total + whole
    return busy, total, count


def busy_cores(before: str, after: str, cpus: Collection[int]) -> float:
    """How many of the CPUs ``cpus`` were busy between two readings of ``/proc/stat``.

    Raises ``ValueError`` when the counters did not move forward (a frozen or reset file tells nothing)."""
    (busy0, total0, _), (busy1, total1, count) = cpu_times(before, cpus), cpu_times(after, cpus)
    if total1 <= total0 or busy1 < busy0:
        raise ValueError("the CPU time counters did not move forward")
    return count * (busy1 - busy0) / (total1 - total0)


def wait_policy(read: Callable[[], str], *, cpus: Collection[int], pause: Callable[[float], None] = time.sleep) -> str:
    """``ACTIVE`` when the CPUs ``cpus`` are idle while this process sleeps for :data:`INTERVAL`, else ``PASSIVE``."""
    try:
        before = read()
        pause(INTERVAL)
        after = read()
        busy = busy_cores(before, after, cpus)
    except (OSError, ValueError, IndexError):  # no /proc/stat (not Linux), or one we cannot parse or trust
        return "PASSIVE"
    return "ACTIVE" if busy < IDLE_CORES else "PASSIVE"


def _read_stat() -> str:
    with open("/proc/stat", encoding="ascii") as f:
        return f.read()


if "OMP_WAIT_POLICY" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = wait_policy(_read_stat, cpus=own_cpus())  # only their load matters
