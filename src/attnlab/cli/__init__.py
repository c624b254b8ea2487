"""The ``attnlab`` command line: one module per command, registered in :mod:`attnlab.cli.main`."""

import click

#: Every ``--seed``: torch's generators take unsigned 64-bit seeds, and a larger number would end in a traceback.
SEED = click.IntRange(0, 2**63 - 1)
