"""The one exception type for bad input.

Library code raises :class:`AttnlabError` when the caller handed it something it cannot use (a token id
outside the vocabulary, a mask of the wrong shape, a file that is not a checkpoint). It subclasses
``ValueError`` so that ordinary ``except ValueError`` code keeps working; the command line catches it and
prints its message as one line with exit status 2, never a stack trace.
"""

from __future__ import annotations

import math
import numbers


class AttnlabError(ValueError):
    """Bad input, described in one line that names the problem."""


def check_count(name: str, value: object, minimum: int = 1) -> int:
    """Return ``value`` if it is a Python ``int`` >= ``minimum``, else raise :class:`AttnlabError`.

    ``True`` is refused although it is an ``int`` (a flag passed where a size belongs), and so are numpy's
    integers: a model's constructor arguments are its JSON config, which cannot hold them.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise AttnlabError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return value


def whole_number(name: str, value: object, minimum: int = 0) -> int:
    """``value`` as an ``int`` if it is a whole number >= ``minimum`` (numpy's integers too, not a bool), else an
    :class:`AttnlabError`: for sizes given to functions, where :func:`check_count`'s JSON-config rule does not
    apply."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise AttnlabError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return int(value)


def check_probability(name: str, value: object) -> float:
    """Return ``value`` if it is a number in [0, 1] (a dropout rate), else raise :class:`AttnlabError`: torch
    says so only at the first forward, or not at all (NaN)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value <= 1:  # (numpy's too)
        raise AttnlabError(f"{name} must be a probability between 0 and 1, got {value!r}")
    return float(value)


def check_flag(name: str, value: object) -> bool:
    """Return ``value`` if it is a ``bool``, else raise :class:`AttnlabError`: a hand-edited JSON config's
    ``"false"`` is a true value to Python and would silently switch the option on."""
    if not isinstance(value, bool):
        raise AttnlabError(f"{name} must be true or false, got {value!r}")
    return value


def check_positive(name: str, value: object) -> float:
    """Return ``value`` if it is a finite real number > 0 (numpy's too), else raise :class:`AttnlabError`: a
    layer norm's epsilon <= 0 or a rotary base <= 0 give NaN outputs, not an error."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
        raise AttnlabError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def in_one_line(err: BaseException) -> str:
    """``Type: the first line of the message``, or the type alone for an empty message: an exception (or a
    warning, ``WarningMessage.message``) named on one line."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__
