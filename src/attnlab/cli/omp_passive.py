"""Imported for its effect, before torch: idle OpenMP threads sleep instead of spinning.

PyTorch's CPU kernels run on OpenMP threads, which by default spin while they wait for the next parallel
region. On a machine whose cores are shared with other processes, a spinning thread takes the core another
thread of the same step needs: with other jobs on the two cores, a two-thread training step of the nanoGPT
configuration was measured 1.3x to 25x slower than with ``OMP_WAIT_POLICY=PASSIVE``; on an idle machine
passive waiting costs about 6% (issue 6, ``notes/issue6.md``). The variable is read once, when the OpenMP
runtime loads with torch, so this module must be imported before torch is; ``setdefault`` keeps a value
the user set (``OMP_WAIT_POLICY=ACTIVE`` for the last 6% on a machine of one's own).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
