"""The ``attnlab`` command line: one module per command, registered in :mod:`attnlab.cli.main`."""
