"""Learning-rate schedules as pure functions of the step.

A schedule that is a function of the step alone needs no state of its own: resuming a run at step
``s`` gives exactly the learning rate an uninterrupted run had there (nanoGPT sets its rate the same way).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnlab.errors import AttnlabError

SCHEDULES = ("cosine", "inverse_sqrt", "constant")


@dataclass(frozen=True)
class Schedule:
    """Learning rate at each optimizer step.

    Args:
        kind: ``"cosine"``: linear warmup to ``lr`` then cosine decay to ``min_lr`` at ``total_steps``;
            ``"inverse_sqrt"``: the paper's ``lr * min(s^-0.5, s * warmup^-1.5) * sqrt(warmup)``, i.e. linear
            warmup to ``lr`` then decay as ``1/sqrt(step)``; ``"constant"``: warmup then flat.
        lr: peak learning rate.
        warmup_steps: steps of linear warmup.
        total_steps: length of the run (cosine reaches ``min_lr`` there).
        min_lr: floor of the cosine decay.
    """

    kind: str = "cosine"
    lr: float = 1e-3
    warmup_steps: int = 0
    total_steps: int = 1
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise AttnlabError(f"unknown schedule {self.kind!r}; choose one of {', '.join(SCHEDULES)}")

    def __call__(self, step: int) -> float:
        """Learning rate for optimizer step ``step`` (0-based)."""
        s = step + 1  # the first update already gets a non-zero rate
        if self.warmup_steps and s <= self.warmup_steps:
            return self.lr * s / self.warmup_steps
        if self.kind == "constant":
            return self.lr
        if self.kind == "inverse_sqrt":
            return self.lr * math.sqrt(max(self.warmup_steps, 1) / s)
        span = max(self.total_steps - self.warmup_steps, 1)
        progress = min((s - self.warmup_steps) / span, 1.0)
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1.0 + math.cos(math.pi * progress))


def length_changed(before: Schedule, after: Schedule, step: int) -> str:
    """The line a resume prints when it is given another length than the run had: where the run now ends and
    how the re-planned schedule moves the learning rate at ``step``, the step it continues from."""
    ends = f"resume: the run now ends at step {after.total_steps} instead of {before.total_steps}; "
    if after.kind != "cosine":  # warmup then 1/sqrt(step) or flat: the length does not enter the rate
        return ends + (f"its {after.kind} learning-rate schedule does not depend on the length, so it goes on as a "
                       f"fresh run of {after.total_steps} steps would")
    return ends + (f"its learning-rate schedule is re-planned over {after.total_steps} steps (at step {step}: "
                   f"{before(step):.3g} -> {after(step):.3g}), so it is not the run a fresh one of {after.total_steps} "
                   "steps would make")
