"""A run of the checks, as a terminal table (rich) or as one JSON object."""

from __future__ import annotations

import io
from collections import Counter
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from attnlab.checks.contract import Contract
from attnlab.checks.result import STATUSES, CheckResult

STYLES = {"pass": "green", "fail": "bold red", "note": "yellow", "skip": "dim"}


@dataclass
class CheckReport:
    """Every check's result for one model.

    Attributes:
        contract: the inputs the model was given.
        seeds: the seeds every check ran on.
        results: one :class:`CheckResult` per check, in order.
        per_position: whether outputs were per position (True), pooled (False) or never seen (None).
        spec: where the model came from (``file.py:factory``), if known.
    """

    contract: Contract
    seeds: list[int]
    results: list[CheckResult]
    per_position: bool | None = None
    spec: str = ""

    @property
    def failed(self) -> bool:
        """True when any check failed (the command then exits with status 1)."""
        return any(r.failed for r in self.results)

    def counts(self) -> dict[str, int]:
        tally = Counter(r.status for r in self.results)
        return {status: tally.get(status, 0) for status in STATUSES}

    def result(self, name: str) -> CheckResult:
        """The result of the check called ``name``."""
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"no check {name!r} in this report")

    @property
    def output(self) -> str:
        return {True: "per-position", False: "pooled", None: "unknown"}[self.per_position]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: ``json.dumps`` of it is strict JSON (non-finite numbers become strings)."""
        return {
            "spec": self.spec, "contract": self.contract.as_dict(), "seeds": len(self.seeds), "output": self.output,
            "passed": not self.failed, "counts": self.counts(), "checks": [r.as_dict() for r in self.results],
        }

    def table(self) -> Table:
        """The report as a rich table: check, result, what was seen."""
        c = self.contract
        pad = "none" if c.pad_id is None else c.pad_id
        spec = f" {self.spec}" if self.spec else ""
        title = (f"attnlab check{spec} ({c.kind}, {self.output} output; pad {pad}, vocab {c.vocab_size}, "
                 f"max length {c.max_length}, {len(self.seeds)} seed{'s' if len(self.seeds) != 1 else ''})")
        table = Table(title=Text(title), title_justify="left")
        table.add_column("check")
        table.add_column("result")
        table.add_column("evidence", overflow="fold")
        for r in self.results:
            table.add_row(r.name, Text(r.status.upper(), style=STYLES[r.status]), Text(r.summary))  # no markup
        return table

    def footer(self) -> str:
        counts = self.counts()
        words = {"pass": "passed", "fail": "failed", "note": "noted", "skip": "skipped"}
        parts = ", ".join(f"{counts[s]} {words[s]}" for s in STATUSES if counts[s])
        return f"{len(self.results)} checks: {parts}"

    def print(self, console: Console | None = None) -> None:
        """Print the table and a one-line tally."""
        console = console or Console()
        console.print(self.table())
        console.print(self.footer())

    def __str__(self) -> str:
        """The table and the tally as plain text, so that ``print(report)`` shows what ``attnlab check`` does."""
        console = Console(width=120, record=True, file=io.StringIO(), color_system=None)
        self.print(console)
        return console.export_text().rstrip()
