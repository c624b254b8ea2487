"""The report page and how it reaches the disk.

:func:`render_page` wraps the sections in one self-contained HTML page (styles inline, figures as
base64 PNG, the explorer's script inline: nothing is fetched when it is opened). :class:`Staging`
writes ``index.html`` and ``numbers.json`` into a temporary folder and moves them into place only when
both are complete, so a run that fails leaves no half-written report that looks finished.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from attnlab.errors import AttnlabError
from attnlab.files import move_into_place, refuse_non_folder, remove_abandoned, temporary_stem
from attnlab.lab.html import Section, esc

HTML_NAME = "index.html"
NUMBERS_NAME = "numbers.json"

STYLE = """
:root { --ink: #1d2733; --muted: #5b6776; --line: #d9dee5; --accent: #1f77b4; --soft: #f4f6f9; }
* { box-sizing: border-box; }
body { font: 16px/1.55 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
       margin: 0; background: #fff; }
main { max-width: 1040px; margin: 0 auto; padding: 1.5rem 1.25rem 4rem; }
header { background: linear-gradient(135deg, #17324d, #1f77b4); color: #fff; padding: 2rem 1.25rem 1.5rem; }
header .inner { max-width: 1040px; margin: 0 auto; }
header h1 { margin: 0 0 .3rem; font-size: 1.9rem; }
header p { margin: .2rem 0; color: #dce8f3; }
h2 { border-bottom: 2px solid var(--line); padding-bottom: .3rem; margin-top: 2.6rem; }
h2 .num { color: var(--accent); margin-right: .4rem; }
h3 { margin: 1.6rem 0 .5rem; font-size: 1.1rem; }
nav ol { columns: 2; padding-left: 1.2rem; }
nav a { color: var(--accent); text-decoration: none; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(220px, 1fr)); gap: .75rem; margin: 1rem 0; }
.card { background: var(--soft); border: 1px solid var(--line); border-radius: 8px; padding: .7rem .9rem; }
.card .label { display: block; font-size: .8rem; color: var(--muted); text-transform: uppercase; letter-spacing: .03em; }
.card .value { font-size: 1.05rem; font-weight: 600; font-variant-numeric: tabular-nums; }
pre { background: var(--soft); border: 1px solid var(--line); border-radius: 6px; padding: .7rem .9rem;
      overflow-x: auto; font-size: .85rem; }
code { font-size: .9em; }
table { border-collapse: collapse; margin: .6rem 0 1rem; font-variant-numeric: tabular-nums; font-size: .9rem; }
th, td { border: 1px solid var(--line); padding: .25rem .55rem; text-align: right; }
th { background: var(--soft); font-weight: 600; white-space: nowrap; }
table.facts td:first-child, table.facts th:first-child { text-align: left; }
table.words td, table.words th { text-align: left; }
caption { caption-side: top; text-align: left; color: var(--muted); font-size: .85rem; padding-bottom: .2rem; }
table.mask td { width: 2.6rem; text-align: center; }
figure { margin: 1rem 0 1.5rem; }
figure img { max-width: 100%; height: auto; display: block; border: 1px solid var(--line); border-radius: 6px; }
figcaption { color: var(--muted); font-size: .88rem; margin-top: .35rem; }
.check { margin: .3rem 0; }
.check .mark { font-weight: 700; margin-right: .3rem; }
.check.ok .mark { color: #2a8a3e; }
.check.bad .mark { color: #c0392b; }
.explorer { border: 1px solid var(--line); border-radius: 10px; padding: 1rem 1.1rem; background: #fbfcfe; }
.explorer .buttons { display: flex; flex-wrap: wrap; gap: .5rem; }
.explorer button { font: inherit; padding: .4rem .9rem; border-radius: 999px; border: 1px solid var(--accent);
                   background: #fff; color: var(--accent); cursor: pointer; }
.explorer button[aria-pressed="true"] { background: var(--accent); color: #fff; }
.explorer .stats { display: flex; gap: 1.5rem; margin: .9rem 0 .3rem; flex-wrap: wrap; }
.explorer .stats .label { display: block; font-size: .78rem; color: var(--muted); text-transform: uppercase; }
.explorer .stats .value { font-size: 1.3rem; font-weight: 700; }
.explorer .hint { color: var(--muted); font-size: .85rem; }
.explorer-table td { width: 3.6rem; text-align: center; }
.explorer-table td.hidden { background: repeating-linear-gradient(45deg, #eceff3, #eceff3 4px, #dfe3e8 4px, #dfe3e8 8px);
                            color: #8a94a0; }
.explorer-table td.sum, .explorer-table th.sum { background: #fff; color: var(--muted); }
footer { color: var(--muted); font-size: .85rem; margin-top: 3rem; border-top: 1px solid var(--line); padding-top: .8rem; }
"""


def render_page(sections: Sequence[Section], *, subtitle: str, footer: str) -> str:
    """The whole report as one HTML document.

    Args:
        sections: in page order; each becomes a numbered ``<section id=key>``.
        subtitle: one line under the title (data source, sizes).
        footer: one line at the end (versions, timing).
    """
    cards = "".join(
        f'<div class="card"><span class="label">{esc(label)}</span><span class="value">{esc(value)}</span></div>'
        for s in sections for label, value in s.highlights
    )
    toc = "".join(f'<li><a href="#{esc(s.key)}">{esc(s.title)}</a></li>' for s in sections)
    body = "".join(
        f'<section id="{esc(s.key)}"><h2><span class="num">{i}.</span>{esc(s.title)}</h2>\n{s.body}</section>\n'
        for i, s in enumerate(sections, start=1)
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>attnlab lab: positional encoding, masks and attention</title>"
        f"<style>{STYLE}</style></head>\n<body>\n"
        '<header><div class="inner"><h1>The attnlab lab</h1>'
        "<p>Positional encoding, word embeddings, masks, attention and a whole transformer, each measured "
        "with the project's own core.</p>"
        f"<p>{esc(subtitle)}</p></div></header>\n"
        f'<main><h2 id="key-numbers">Key numbers</h2><div class="cards">{cards}</div>\n'
        f"<nav><ol>{toc}</ol></nav>\n{body}"
        f"<footer>{esc(footer)} Every number computed here is also in {NUMBERS_NAME} (the seeds' own figures are "
        "quoted in the text).</footer></main>\n"
        "</body></html>\n"
    )


class Staging:
    """A temporary folder for the report, published into ``out`` only on success.

    Created before any work starts, so an output folder that cannot be written fails fast. When ``out``
    does not exist the staged folder is renamed to it in one step; when it does (a previous report, or
    a folder holding other files) the staging folder lives inside it and the two files are moved in,
    ``numbers.json`` first and ``index.html`` last (also when the folder appears while the run works: another
    run, or a user). Other files in ``out`` are never touched.
    """

    def __init__(self, out: str | Path) -> None:
        self.out = Path(out)
        if self.out.exists() and not self.out.is_dir():
            raise AttnlabError(f"cannot write the report to {self.out}: it exists and is not a folder")
        refuse_non_folder(self.out, "--out")  # (a link to a folder that does not exist)
        blocker = next((a for a in self.out.absolute().parents if a.exists()), None)  # the nearest that exists
        if blocker is not None and not blocker.is_dir():
            raise AttnlabError(f"cannot write the report to {self.out}: {blocker} is a file, not a folder")
        self._into_existing = self.out.is_dir()
        for name in (NUMBERS_NAME, HTML_NAME):  # checked now: found at the end, one file would be replaced alone
            target = self.out / name
            if target.is_dir():
                raise AttnlabError(f"cannot write the report to {self.out}: {target} is in the way (not a file)")
        parent = self.out if self._into_existing else self.out.absolute().parent
        missing = [a for a in (parent, *parent.parents) if not a.exists()]
        # The folders this run makes, removed again if it fails (a failed run leaves nothing behind): those its own
        # mkdir made, not one that another run made meanwhile, and may be about to use. Deepest first.
        self._made: list[Path] = []
        prefix = f".{temporary_stem(self.out.name or 'report')}.partial-"
        # Until the constructor returns, `with` will not call __exit__: a failure here, Ctrl-C and SIGTERM included,
        # removes what it made itself (all but a folder that mkdtemp made and had not yet named: a later run
        # removes that one, its writer gone).
        made: Path | None = None
        try:
            for folder in reversed(missing):
                try:
                    folder.mkdir()
                except FileExistsError:
                    continue
                self._made.insert(0, folder)
            # The process id in the name lets a later run tell a staging folder whose writer was killed.
            remove_abandoned(parent, re.compile(re.escape(prefix) + r"(\d{1,9})-[^/]+"))
            made = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))
            made.chmod(0o755)  # mkdtemp makes it private; the published report should be readable
            self.path = made
        except BaseException as err:
            if made is not None:
                shutil.rmtree(made, ignore_errors=True)
            self._remove_made_folders()
            if isinstance(err, OSError):
                raise AttnlabError(f"cannot write the report to {self.out}: {err.strerror or err}") from err
            raise

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        if kind is not None:
            self.discard()

    def discard(self) -> None:
        """Remove the staging folder and everything in it, and the empty folders made to hold it."""
        shutil.rmtree(self.path, ignore_errors=True)
        self._remove_made_folders()

    def _remove_made_folders(self) -> None:
        for folder in self._made:  # deepest first; one that something else has filled meanwhile stays
            try:
                folder.rmdir()
            except FileNotFoundError:  # (not made: the failure came first, or something else removed it)
                continue
            except OSError:
                break

    def write(self, html: str, numbers: dict[str, Any]) -> Path:
        """Write both files into the staging folder, then publish them. Returns the report folder."""
        try:
            (self.path / NUMBERS_NAME).write_text(json.dumps(numbers, indent=2) + "\n", encoding="utf-8")
            (self.path / HTML_NAME).write_text(html, encoding="utf-8")
            if not self._into_existing and self._renamed():
                return self.out
            self._publish()
            self.path.rmdir()
        except OSError as err:
            self.discard()
            raise AttnlabError(f"cannot write the report to {self.out}: {err.strerror or err}") from err
        return self.out

    def _publish(self) -> None:
        """Move both staged files into the existing report folder, the page last (its presence means "complete").
        If the page's move fails (or Ctrl-C falls between the two), the numbers the old page was made with go back:
        a report is old or new, never an old page beside new numbers."""
        numbers, previous = self.out / NUMBERS_NAME, self.path / f"previous-{NUMBERS_NAME}"
        old = Path(os.path.realpath(numbers))  # (a link is written through, see move_into_place)
        kept = old.is_file()  # (a pipe or a device is written into: nothing to keep)
        created = not old.exists()  # (also behind a link to a file not there yet)
        if kept:
            try:  # a second name for the old file, in the staging folder (next to the report: same file system)
                os.link(old, previous)
            except OSError:
                shutil.copy2(old, previous)
        move_into_place(self.path / NUMBERS_NAME, numbers)  # (by a rename: no space needed)
        try:
            move_into_place(self.path / HTML_NAME, self.out / HTML_NAME)
        except BaseException:
            with contextlib.suppress(OSError, AttnlabError):  # (the page's own failure is what is said)
                if kept:  # through a link, onto another file system too, as the numbers went
                    move_into_place(previous, numbers)
                elif created:
                    old.unlink()
            raise
        previous.unlink(missing_ok=True)

    def _renamed(self) -> bool:
        """Rename the staging folder to the report folder; False if a folder of that name has appeared meanwhile
        (another run, or a user: its files are then moved in as into any existing folder)."""
        try:
            os.rename(self.path, self.out)
        except OSError as err:
            if err.errno in (errno.ENOTEMPTY, errno.EEXIST) and self.out.is_dir():
                return False
            raise
        return True
