"""The one exception type for bad input.

Library code raises :class:`AttnlabError` when the caller handed it something it cannot use (a token id
outside the vocabulary, a mask of the wrong shape, a file that is not a checkpoint). It subclasses
``ValueError`` so that ordinary ``except ValueError`` code keeps working; the command line catches it and
prints its message as one line with exit status 2, never a stack trace.
"""

from __future__ import annotations


class AttnlabError(ValueError):
    """Bad input, described in one line that names the problem."""
