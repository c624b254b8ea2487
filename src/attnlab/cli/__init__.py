"""The ``attnlab`` command line: one module per command, registered in :mod:`attnlab.cli.main`."""

from attnlab.cli.params import WholeNumber

#: Every ``--seed``. torch's CPU generator (a Mersenne Twister) keeps only the low 32 bits of a seed, so 2**32
#: would give the very numbers of 0: the range stops where seeds stop being told apart.
SEED = WholeNumber(0, 2**32 - 1)
