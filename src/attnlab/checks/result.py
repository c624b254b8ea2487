"""What a check returns: a status, a one-line summary, and the evidence behind it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["pass", "fail", "note", "skip"]

#: ``note``: reported, not failed (train mode of a model without dropout); ``skip``: does not apply.
STATUSES: tuple[str, ...] = ("pass", "fail", "note", "skip")


@dataclass
class CheckResult:
    """One check's verdict.

    Attributes:
        name: the check, e.g. ``"causal"``.
        status: ``pass``, ``fail``, ``note`` (reported, not failed) or ``skip`` (does not apply).
        summary: one line for a table; for a failure it says where, by how much and on which input.
        tolerance: the rule the outputs were judged by.
        seeds: how many seeds ran (up to and including a failing one).
        evidence: the details, JSON-ready: ``seed``, the ``input`` ids, ``positions`` as [row, position]
            pairs, ``max_diff`` and ``bound``; or the ``exception`` the model raised, or the ``output_error``
            when what it returned cannot be used, with the ``seed`` and ``input`` of that call.
    """

    name: str
    status: Status
    summary: str
    tolerance: str = ""
    seeds: int = 0
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Tensors become lists here, so evidence compares, prints and pickles as plain Python.
        self.evidence = jsonable(self.evidence, strict=False)

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    def describe(self) -> str:
        """Several lines for an assertion message: the summary, then every piece of evidence."""
        lines = [f"{self.name}: {self.status}: {self.summary}"]
        if self.tolerance:
            lines.append(f"  tolerance: {self.tolerance}")
        lines += [f"  {key}: {value}" for key, value in self.evidence.items()]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return jsonable({
            "name": self.name, "status": self.status, "summary": self.summary, "tolerance": self.tolerance,
            "seeds": self.seeds, "evidence": self.evidence,
        })


def jsonable(value: Any, *, strict: bool = True) -> Any:
    """``value`` with tensors as lists; with ``strict`` also non-finite floats as strings ("inf", "nan"),
    so that ``json.dumps(..., allow_nan=False)`` accepts it."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, dict):
        return {str(k): jsonable(v, strict=strict) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, strict=strict) for v in value]
    if strict and isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def shown(values: Any, head: int = 10, tail: int = 3) -> str:
    """A list (or 1-D tensor) as a summary line shows it: whole when short, else its first ``head`` and last
    ``tail`` items around the count of the others (rows of the longest length run to thousands of ids; the
    evidence keeps them whole)."""
    items = values.tolist() if hasattr(values, "tolist") else list(values)
    if len(items) <= head + tail + 1:
        return str(items)
    first, last = ", ".join(map(str, items[:head])), ", ".join(map(str, items[-tail:]))
    return f"[{first}, ... {len(items) - head - tail} more ..., {last}]"
