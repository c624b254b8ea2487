"""Imported for its effect, before torch: how idle OpenMP threads wait, chosen from how busy the machine is.

PyTorch's CPU kernels run on OpenMP threads, which wait for the next parallel region spinning (``ACTIVE``)
or asleep (``PASSIVE``). On an idle machine spinning wins: a two-thread training step of nanoGPT's
configuration took 36-38 ms spinning, 43-48 ms with libgomp's default (spin a little, then sleep) and
51-60 ms asleep (AMD EPYC, 2 cores; issue 6). On a machine whose cores other processes are using, a
spinning thread takes the core another thread of the same step needs: 1.3x to 25x slower than asleep.

So the language-model commands look at the machine for a tenth of a second before torch loads
(``/proc/stat``): when other processes keep less than :data:`IDLE_CORES` of a core busy they spin, else
they sleep, as they also do where ``/proc/stat`` cannot be read. The variable is read once, when the
OpenMP runtime loads with torch, so this module must be imported before torch is; a value the user set is
kept (``OMP_WAIT_POLICY=PASSIVE`` on a machine that will be shared later, ``ACTIVE`` to always spin).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

#: Other processes using less than this many cores count as an idle machine.
IDLE_CORES = 0.25
#: How long the machine is watched.
INTERVAL = 0.1


def cpu_times(stat: str) -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs from the text of ``/proc/stat`` (its first, ``cpu`` line)."""
    fields = [int(v) for v in stat.split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    total = sum(fields[:8])  # guest time is counted inside user time already
    return total - idle, total


def busy_cores(before: str, after: str, cores: int) -> float:
    """How many cores were busy between two readings of ``/proc/stat``.

    Raises ``ValueError`` when the counters did not move forward (a frozen or reset file tells nothing)."""
    (busy0, total0), (busy1, total1) = cpu_times(before), cpu_times(after)
    if total1 <= total0 or busy1 < busy0:
        raise ValueError("the CPU time counters did not move forward")
    return cores * (busy1 - busy0) / (total1 - total0)


def wait_policy(read: Callable[[], str], *, cores: int, pause: Callable[[float], None] = time.sleep) -> str:
    """``ACTIVE`` when the machine is idle while this process sleeps for :data:`INTERVAL`, else ``PASSIVE``."""
    try:
        before = read()
        pause(INTERVAL)
        after = read()
        busy = busy_cores(before, after, cores)
    except (OSError, ValueError, IndexError):  # no /proc/stat (not Linux), or one we cannot parse or trust
        return "PASSIVE"
    return "ACTIVE" if busy < IDLE_CORES else "PASSIVE"


def _read_stat() -> str:
    with open("/proc/stat", encoding="ascii") as f:
        return f.read()


if "OMP_WAIT_POLICY" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = wait_policy(_read_stat, cores=os.cpu_count() or 1)
