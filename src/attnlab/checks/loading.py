"""Finding the model to check from a SPEC: ``path/to/file.py:factory`` or ``package.module:factory``.

The factory takes no arguments and returns the callable model. Every way this can go wrong (no such
file or module, no such factory, an import or the factory raising or calling ``sys.exit``, a factory
returning something that cannot be called) is an :class:`~attnlab.errors.AttnlabError` with one line
that says which. A ``module:factory`` spec is looked up from the current directory too, as
``python -m`` and ``uvicorn`` do, so ``attnlab check mymodels:factory`` finds ``./mymodels.py``; a
``file.py:factory`` spec puts the file's own folder on the path, as ``python file.py`` does, so the file
can import its neighbours.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from torch import nn

from attnlab.errors import AttnlabError, in_one_line


def _a(value: Any) -> str:
    """``value``'s type with its article, for a message: ``an int``, ``a list``, ``None``."""
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"


def _import_file(path: Path) -> ModuleType:
    if path.is_dir():  # "runs/lm:factory": a run folder is a SPEC of its own, with nothing after it
        raise AttnlabError(f"{path} is a folder: give a run folder alone (attnlab check {path}), or a factory as "
                           "path/to/file.py:factory")
    if not path.is_file():
        raise AttnlabError(f"no such file: {path}")
    name = f"_attnlab_check_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise AttnlabError(f"cannot import {path} as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up here
    # As `python file.py` does: the file's folder goes on the path, so `from model import GPT` next to it works.
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # SystemExit too: sys.exit(3) would end the command silently with status 3
        sys.modules.pop(name, None)
        raise AttnlabError(f"importing {path} failed: {in_one_line(err)}") from err
    return module


def _import_module(name: str) -> ModuleType:
    # A command's sys.path starts at its script's folder, not the current one; the factory's module usually
    # sits in the current one. It stays on the path: a factory may import its neighbours when called.
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name and (name == err.name or name.startswith(err.name + ".")):
            raise AttnlabError(f"no such module: {name} (looked in the current directory and on sys.path; "
                               f"for a file elsewhere, use path/to/file.py:factory)") from err
        raise AttnlabError(f"importing {name} failed: {in_one_line(err)}") from err
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # sys.exit() at import too, as in _import_file
        raise AttnlabError(f"importing {name} failed: {in_one_line(err)}") from err


def load_factory(spec: str) -> Callable[[], Any]:
    """The factory a SPEC names (not called yet)."""
    where, sep, attr = spec.rpartition(":")
    if not sep or not where or not attr:
        raise AttnlabError(f"SPEC must be path/to/file.py:factory or package.module:factory, got {spec!r}")
    is_file = where.endswith(".py") or "/" in where or "\\" in where
    module = _import_file(Path(where)) if is_file else _import_module(where)
    if not hasattr(module, attr):
        # Only the functions and classes of its own package (a package re-exports its modules' factories), not
        # torch, nn and everything else it imports.
        package = module.__name__.split(".")[0]
        own = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                     and str(getattr(v, "__module__", "")).split(".")[0] == package)
        listed = ", ".join(own[:12]) + (f" and {len(own) - 12} more" if len(own) > 12 else "")
        raise AttnlabError(f"{where} has no factory {attr!r} (the functions and classes it defines: "
                           f"{listed or 'none'})")
    factory = getattr(module, attr)
    if not callable(factory):
        raise AttnlabError(f"{where}:{attr} is {_a(factory)}, not a factory function")
    return factory


def load_model(spec: str) -> Callable[..., Any]:
    """Call the factory a SPEC names and return the model it builds; a SPEC naming a model itself (an
    ``nn.Module`` instance at module level, ``model = GPT(config)``) gives that model."""
    factory = load_factory(spec)
    if isinstance(factory, nn.Module):  # called without its inputs, it would fail with a misleading TypeError
        return factory
    try:
        model = factory()
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # sys.exit() too, as in _import_file
        raise AttnlabError(f"factory {spec} raised {in_one_line(err)}") from err
    if not callable(model):
        raise AttnlabError(f"factory {spec} returned {_a(model)}, which cannot be called as a model")
    return model
