"""``attnlab probe KIND RUN``: seed 004's probes on a trained run and the user's data."""

from __future__ import annotations

import click

from attnlab.cli.lazy import LazyGroup

#: probe name -> "module:attribute" of its click command.
PROBE_COMMANDS: dict[str, str] = {
    "order": "attnlab.cli.probe_classify:probe_order",
    "padding": "attnlab.cli.probe_classify:probe_padding",
}


@click.group(cls=LazyGroup, lazy_commands=PROBE_COMMANDS)
def probe() -> None:
    """Probe a trained classifier: word order and position (order), padding and masks (padding)."""
