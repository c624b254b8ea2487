"""The ``attnlab`` command line: one module per command, registered in :mod:`attnlab.cli.main`."""

from attnlab.cli.params import WholeNumber

#: Every ``--seed``: torch's generators take unsigned 64-bit seeds, and a larger number would end in a traceback.
SEED = WholeNumber(0, 2**63 - 1)
