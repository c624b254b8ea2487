"""Entry point of the ``attnlab`` command.

Every command is a click command in its own module under ``attnlab.cli``; :data:`COMMANDS` lists them
(``name: "module:function"``) and a module is imported only when its command runs: ``attnlab --version`` and
``attnlab --help`` import none (``--help`` reads each command's summary from its module's source, see
:mod:`attnlab.cli.lazy`), which matters as most of them import torch, a few seconds.
Bad input raised as :class:`~attnlab.errors.AttnlabError` (or an unreadable file) becomes one line on
stderr, ``error: ...``, and exit status 2; never a stack trace.
"""

from __future__ import annotations

import codecs
import io
import os
import re
import select
import signal
import stat
import sys
from typing import Any

import click

from attnlab import __version__
from attnlab.cli.lazy import LazyGroup, missing_package
from attnlab.errors import AttnlabError

#: command name -> "module:attribute" of its click command, in the order ``--help`` lists them.
COMMANDS: dict[str, str] = {
    "summary": "attnlab.cli.summary:summary",
    "check": "attnlab.cli.check:check",
    "lab": "attnlab.cli.lab:lab",
    "train": "attnlab.cli.train:train",
    "eval": "attnlab.cli.evaluate:evaluate",
    "predict": "attnlab.cli.predict:predict",
    "probe": "attnlab.cli.probe:probe",
    "translate": "attnlab.cli.translate:translate",
    "attention": "attnlab.cli.attention:attention",
    "generate": "attnlab.cli.generate:generate_cmd",
    "experiment": "attnlab.cli.experiment:experiment",
}


def _rank_prefix() -> str:
    """``[rank N] `` in the lines of a process other than the first under torchrun (every process reports its
    own error, and they are told apart), nothing otherwise."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    return f"[rank {rank}] " if world > 1 and rank else ""


def _error(message: str) -> None:
    click.echo(f"{_rank_prefix()}error: {message}", err=True)


class _MainGroup(LazyGroup):
    """The top-level group: lazy commands, and bad input reported as one line with exit status 2."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        """Click's entry point, with its usage errors (an unknown option, a value that is not a number, a
        missing required option) as one ``error:`` line instead of Click's usage block, exit status 2."""
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        _utf8_stdout()
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except click.ClickException as err:
            if isinstance(err, getattr(click.exceptions, "NoArgsIsHelpError", ())):  # a bare group (Click 8.2+)
                err.show()
                sys.exit(err.exit_code)
            ctx = getattr(err, "ctx", None)
            hint = f" (see '{ctx.command_path} --help')" if isinstance(err, click.UsageError) and ctx else ""
            # One line: Click lists choices on lines of their own (the user's own text keeps its spaces).
            message = " ".join(line.strip() for line in err.format_message().splitlines() if line.strip())
            _error(f"{message}{hint}")
            sys.exit(err.exit_code)
        except click.Abort as err:  # Click's form of KeyboardInterrupt (Ctrl-C) and of Terminated
            _exit_interrupted(err)
        except AttnlabError as err:  # raised outside a command: the help text written to a closed stdout
            _error(str(err))
            sys.exit(2)
        except ModuleNotFoundError as err:  # a command's (or `--help`'s, for a command it has to import)
            package = missing_package(err)  # (None: not an optional package, but a part of attnlab or torch missing)
            if package is None:
                raise
            _error(f"this command needs the package {package}, which is not installed: pip install 'attnlab[all]' "
                   f"(or pip install {package})")
            sys.exit(2)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AttnlabError as err:
            _error(str(err))
            ctx.exit(2)
        except Terminated as err:  # said here: Click would first print the blank line that follows a ^C on a terminal
            _exit_interrupted(err)
        except BrokenPipeError as err:
            if not _stdout_reader_left():
                _error(str(err.strerror or err))
                ctx.exit(2)
            # The reader left (`attnlab generate ... | head`): stop quietly as other command-line tools do, with
            # SIGPIPE's status; stdout goes to /dev/null so that Python's own flush at exit fails no more.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(128 + signal.SIGPIPE)
        except OSError as err:  # a path that does not exist, a folder we may not write...
            where = f": {err.filename}" if getattr(err, "filename", None) else ""
            _error(f"{err.strerror or err}{where}")
            ctx.exit(2)
        except UnicodeEncodeError as err:
            said = _unwritable_text(err)
            if said is None:
                raise
            _error(said)
            ctx.exit(2)
        except (MemoryError, RuntimeError) as err:  # torch's OutOfMemoryError is a RuntimeError
            said = _out_of_memory(err)
            if said is None:
                raise
            _error(said)
            ctx.exit(2)


def _utf8_stdout() -> None:
    """Write standard output in UTF-8 whatever the locale, as the commands read their text arguments and files:
    under ``LC_ALL=C`` Python's stdout is ASCII, and a prompt or translation holding 'é' ended in a
    UnicodeEncodeError traceback halfway through the text. An encoding asked for (``PYTHONIOENCODING=latin-1``)
    is kept; so is the error handler (``surrogateescape`` there writes a path's undecodable bytes back as they
    were, and ``PYTHONIOENCODING=:strict`` names a handler alone)."""
    stream = sys.stdout
    encoding = getattr(stream, "encoding", None)
    asked = os.environ.get("PYTHONIOENCODING", "").partition(":")[0]
    if not encoding or not hasattr(stream, "reconfigure") or asked:
        return
    try:
        utf8 = codecs.lookup(encoding).name == "utf-8"
    except LookupError:
        utf8 = False
    if not utf8:
        stream.reconfigure(encoding="utf-8", errors=stream.errors)


def _unwritable_text(err: UnicodeEncodeError) -> str | None:
    """The line for text that standard output's encoding cannot write, else None. :func:`_utf8_stdout` keeps an
    encoding the user asked for (``PYTHONIOENCODING=ascii``), whose strict handler then stopped a command with a
    traceback halfway through its text (an experiment, after writing all its files)."""
    encoding = getattr(sys.stdout, "encoding", None)
    try:
        same = bool(encoding) and codecs.lookup(encoding).name == codecs.lookup(err.encoding).name
    except LookupError:
        same = False
    if not same:
        return None
    return (f"standard output's encoding, {encoding} (as PYTHONIOENCODING or the console sets it), cannot write "
            f"{err.object[err.start:err.end]!r}: set PYTHONIOENCODING=utf-8, or {encoding}:backslashreplace to have "
            "such characters written as escapes")


def _out_of_memory(err: BaseException) -> str | None:
    """The line for an allocation that failed (a model or a batch too large for this machine), else None."""
    text = str(err)
    if not (isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError"
            or "can't allocate memory" in text or "out of memory" in text.lower()):
        return None
    asked = re.search(r"allocate (\d+) bytes", text)
    size = f" ({int(asked.group(1)) / 1e9:,.1f} GB asked for)" if asked else ""
    return f"out of memory{size}: the model or the work asked of it is too large for this machine's memory"


def _stdout_reader_left() -> bool:
    """Whether standard output is a pipe whose reading end has been closed (poll reports an error on it)."""
    try:
        fd = sys.stdout.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no real stdout (a test's capture), or no poll (Windows)
        return False


@click.group(cls=_MainGroup, lazy_commands=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="attnlab")
def cli() -> None:
    """Build, train and interrogate transformers."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a job scheduler), raised the way Ctrl-C raises KeyboardInterrupt.

    Python's default for SIGTERM ends the process on the spot; raising instead runs every ``finally`` and
    context manager on the way out, so staged reports and temporary files are removed as after Ctrl-C. A
    KeyboardInterrupt subclass, so that code letting Ctrl-C through (the checks catch everything a user's
    model raises, ``SystemExit`` included, but not that) lets it through too.
    """


def _terminated(signum: int, frame: Any) -> None:
    # Once: the process is on its way out, and a second TERM (two timeouts, a scheduler and its wrapper) raised in
    # the middle of the cleanup, or in an atexit callback, would cut it short with a traceback.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated()


def _exit_interrupted(err: BaseException) -> None:
    terminated = isinstance(err, Terminated) or isinstance(err.__cause__, Terminated)
    click.echo(_rank_prefix() + ("terminated" if terminated else "interrupted"), err=True)
    sys.exit(128 + (signal.SIGTERM if terminated else signal.SIGINT))


#: Commands whose results are files: what they print is a summary, which a closed standard output may lose.
FILE_COMMANDS = ("train", "lab", "attention", "experiment")


class _ClosedStdout(io.TextIOBase):
    """``sys.stdout`` for a command started with standard output closed (``attnlab ... >&-``).

    Python leaves ``sys.stdout`` None then, and click and rich drop every line written to it without a word: a
    command whose results are what it prints (``predict``, ``generate``, ``check``...) would exit 0 having shown
    nothing. Writing raises instead, so such a command stops with one error line; for :data:`FILE_COMMANDS`
    (``discard``) the lines go nowhere, as they would to /dev/null.
    """

    def __init__(self, *, discard: bool) -> None:
        super().__init__()
        self.discard = discard

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self.discard:
            return len(text)
        raise AttnlabError("standard output is closed (started with '>&-'): this command writes its output there")


def _stand_in_for_closed_stdout() -> None:
    """Give a closed standard output a stand-in (:class:`_ClosedStdout`)."""
    if sys.stdout is not None:
        return
    words = [arg for arg in sys.argv[1:] if not arg.startswith("-")]
    # Help, and the usage a group without its subcommand prints, is what the command shows: refused like a result.
    shows_help = any(arg in ("-h", "--help", "--version") for arg in sys.argv[1:]) or words in (["train"],
                                                                                                ["experiment"])
    files_only = bool(words) and words[0] in FILE_COMMANDS and not shows_help
    # Descriptor 1 is free: hold it with /dev/null, or the next file opened (a checkpoint being written) would take
    # it and receive whatever a C library prints to standard output.
    held = os.open(os.devnull, os.O_WRONLY)
    if held != 1:
        os.dup2(held, 1)
        os.close(held)
    sys.stdout = _ClosedStdout(discard=files_only)


def main() -> None:
    """Console-script entry point."""
    signal.signal(signal.SIGTERM, _terminated)
    _stand_in_for_closed_stdout()
    if _rank_prefix():  # under torchrun the first process reports; the others' output would repeat it
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (open for the life of the process)
    # (`python -m attnlab` is named so in usage lines and hints: `attnlab` may not be on the PATH there)
    started = getattr(sys.modules.get("__main__"), "__spec__", None)
    prog = "python -m attnlab" if getattr(started, "name", None) == "attnlab.__main__" else "attnlab"
    try:
        cli.main(prog_name=prog)
    except KeyboardInterrupt as err:
        _exit_interrupted(err)


if __name__ == "__main__":
    main()
