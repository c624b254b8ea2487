"""Labelled text tables: CSV and JSON-lines readers for text classification.

A table is a file with one example a row (CSV, with a header) or a line (JSON lines, one object each).
Two columns matter: the **text** (``--text-column``, default ``text``) and the **label**
(``--label-column``). The label column defaults to ``label``; a file without one but with exactly two
columns uses the other one, as BANKING77's ``text,category`` does. Anything else is an
:class:`~attnlab.errors.AttnlabError` whose one line names the file and lists the columns it has.

The format is chosen by the file name: ``.jsonl``, ``.ndjson`` and ``.json`` are JSON lines, everything
else is CSV (``.tsv`` with tabs). Rows whose text is empty are an error (a model cannot route silence,
and an empty row usually means a shifted or broken export), reported with their count and the first
row's number. In JSON lines a number or true/false is read as its JSON spelling (label ``3`` is class "3");
an array or an object in the text or label column is an error (one label a row: no multi-label data).
"""

from __future__ import annotations

import csv
import io
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.errors import AttnlabError
from attnlab.files import decode_utf8

#: A line end as JSON lines and CSV files have them: \n, \r\n, or an old Mac's \r (and not the Unicode separators that
#: str.splitlines also splits at, which a text may hold).
LINE_END = re.compile(r"\r\n|\r|\n")

JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
#: The formats in a sentence, for the commands' help.
TABLE_FORMATS = ("CSV with a header (.tsv: tab-separated; any other name: comma-separated) or JSON lines "
                 "(.jsonl, .ndjson, .json: one object a line)")


@dataclass
class Table:
    """The texts and labels of one file.

    Attributes:
        texts: one string per example.
        labels: one label per example (as strings), or None when the file was read without labels.
        path: where it came from.
        columns: the columns the file has, in order.
        text_column, label_column: the columns used.
        label_numbers: the labels that were JSON numbers, with the number each stands for (a CSV has none: its
            cells are text, "1.1" and "1.10" two section labels).
    """

    texts: list[str]
    labels: list[str] | None
    path: Path
    columns: list[str]
    text_column: str
    label_column: str | None
    label_numbers: dict[str, int | float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, index: list[int], name: str) -> Table:
        """The rows ``index`` as a new table (``name`` describes it in messages)."""
        labels = None if self.labels is None else [self.labels[i] for i in index]
        return Table([self.texts[i] for i in index], labels, Path(name), self.columns, self.text_column,
                     self.label_column, self.label_numbers)


def _read_rows(path: Path) -> tuple[list[str], list[dict[str, object]]]:
    """The column names and the rows of a CSV or JSON-lines file."""
    if not path.exists():
        raise AttnlabError(f"data file not found: {path}")
    if path.is_dir():
        raise AttnlabError(f"{path} is a folder, not a table file")
    if not path.is_file():
        raise AttnlabError(f"{path} is not a regular file (a pipe or a device, say): give the table as a file")
    raw = decode_utf8(path.read_bytes(), path, bom=True)
    if path.suffix.lower() in JSON_SUFFIXES:
        rows: list[dict[str, object]] = []
        columns: dict[str, None] = {}
        # (JSON strings cannot hold a raw line end, but may hold U+2028 and the like, which json.dumps leaves as is)
        for lineno, line in enumerate(LINE_END.split(raw), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise AttnlabError(f"{path}:{lineno}: not a JSON object per line ({err.msg})") from err
            if not isinstance(obj, dict):
                raise AttnlabError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            columns.update(dict.fromkeys(obj))
            rows.append(obj)
        return list(columns), rows
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    # The csv module refuses a field past 128 KiB by default (without its line): no text is longer than its file.
    limit = csv.field_size_limit()
    csv.field_size_limit(max(limit, len(raw) + 1))
    try:
        # newline="": the csv module itself splits the records, so a quoted text keeps its line breaks (and
        # U+2028) instead of being cut at them
        reader = csv.DictReader(io.StringIO(raw, newline=""), delimiter=delimiter)
        fields = list(reader.fieldnames or [])
        rows, ended = [], reader.line_num  # the line the previous record ended on
        for row in reader:
            # DictReader files surplus fields under None and fills missing ones with None: either way the row's
            # text and label would be taken from the wrong places without a word.
            if None in row or None in row.values():
                lines = LINE_END.split(raw.rstrip("\r\n"))
                record = "\n".join(lines[ended:reader.line_num])
                if reader.line_num >= len(lines) and reader.line_num - ended > 1 and _unclosed_quote(record, delimiter):
                    # this record runs to the end of the file inside a quote: one opened and never closed took in
                    # every line after it. Said where it opened (the record's first line that is not blank).
                    start = next((i for i in range(ended, reader.line_num) if lines[i].strip()), ended) + 1
                    raise AttnlabError(f"{path}:{start}: a quote opened on this line is never closed, so the text "
                                       f"runs on to the end of the file (line {reader.line_num}); close it, or write "
                                       f"a quote inside a quoted text as two (\"\")")
                count = len(fields) + len(row.get(None) or []) if None in row else sum(v is not None for v in row.values())
                start = next((i for i in range(ended, reader.line_num) if lines[i].strip()), ended) + 1
                if count > len(fields) and _swallowed_rows(record, delimiter):
                    # too many fields, and a quoted text over several lines holding the delimiter: the quote of its
                    # first line ran on into the next rows (a closed quote over two lines, then a field too many,
                    # is said as any row of too many fields)
                    raise AttnlabError(f"{path}:{start}: a quote opened on this line runs on to line "
                                       f"{reader.line_num}, where the record has {count} field"
                                       f"{'s' if count != 1 else ''} and the header {len(fields)}; close it where its "
                                       "text ends, or write a quote inside a quoted text as two (\"\")")
                raise AttnlabError(f"{path}:{reader.line_num}: {count} field{'s' if count != 1 else ''} where the "
                                   f"header has {len(fields)}; quote a text that holds the delimiter")
            if list(row.values()) == fields:  # files joined with their headers: its names would become a text and a
                raise AttnlabError(f"{path}:{reader.line_num}: this row repeats the header ({delimiter.join(fields)}), "
                                   "as when two exports are joined; remove it")  # class of their own, silently
            rows.append(dict(row))
            ended = reader.line_num
    except csv.Error as err:
        raise AttnlabError(f"{path} is not a readable CSV file: {err}") from err
    finally:
        csv.field_size_limit(limit)
    return fields, rows


def _swallowed_rows(record: str, delimiter: str) -> bool:
    """Whether the first field of a record, ``record`` being its text, is quoted over several lines and holds the
    delimiter on a line before its last: rows of the table taken into a quote that was not closed where meant."""
    first = next(csv.reader(io.StringIO(record.lstrip("\r\n"), newline=""), delimiter=delimiter), [""])[0]
    return any(delimiter in line for line in first.splitlines()[:-1])


def _unclosed_quote(raw: str, delimiter: str) -> bool:
    """Whether the text of a record, ``raw``, ends inside a quoted field (the csv module, strict, says so; lenient,
    as the table is read, it reads on to the end of the file)."""
    try:
        for _ in csv.reader(io.StringIO(raw, newline=""), delimiter=delimiter, strict=True):
            pass
    except csv.Error as err:
        return "unexpected end of data" in str(err)
    return False


def pick_label_column(columns: list[str], text_column: str, label_column: str | None, path: Path,
                      prefer: str | None = None) -> str:
    """The label column: the one asked for, else ``prefer`` if present (the column a run was trained on),
    else ``label``, else the only other column of a two-column file."""
    if label_column is None and prefer in columns:
        return prefer
    if label_column is not None:
        if label_column not in columns:
            raise AttnlabError(f"{path} has no label column {label_column!r}; its columns are {columns}")
        return label_column
    if "label" in columns:
        return "label"
    others = [c for c in columns if c != text_column]
    if len(columns) == 2 and len(others) == 1:
        return others[0]
    raise AttnlabError(f"{path} has no 'label' column and not exactly one other column besides {text_column!r} "
                       f"to use instead; its columns are {columns}: pass --label-column")


def read_table(
    path: str | Path,
    *,
    text_column: str = "text",
    label_column: str | None = None,
    prefer_label_column: str | None = None,
    with_labels: bool = True,
) -> Table:
    """Read a CSV or JSON-lines file of labelled texts.

    Args:
        path: the file.
        text_column: the column holding the text.
        label_column: the column holding the label (None: ``label``, or the one other column).
        prefer_label_column: used when ``label_column`` is None and the file has it.
        with_labels: read the labels too (False for ``predict``-style input, where there may be none).

    Raises:
        AttnlabError: missing file, no such column, empty texts or missing labels, no rows.
    """
    path = Path(path)
    columns, rows = _read_rows(path)
    if not rows:
        raise AttnlabError(f"{path} holds no rows")
    if text_column not in columns:
        raise AttnlabError(f"{path} has no text column {text_column!r}; its columns are {columns}: pass --text-column")
    _refuse_twice(columns, text_column, path)
    label_col = pick_label_column(columns, text_column, label_column, path, prefer_label_column) if with_labels else None
    if label_col is not None:
        _refuse_twice(columns, label_col, path)
        if label_col == text_column:  # the model would read its answer in its input
            raise AttnlabError(f"{path}: the text column {text_column!r} is also the label column; name the column "
                               "that holds the labels with --label-column (or the texts' with --text-column)")
    _refuse_nested(rows, text_column, label_col, path)
    texts = [_cell(r.get(text_column)) for r in rows]
    empty = [i for i, t in enumerate(texts) if not t.strip()]
    if empty:
        raise AttnlabError(f"{path}: {len(empty)} row(s) have an empty {text_column!r} (first: {_row_name(path, empty[0])})")
    labels = None
    if label_col is not None:
        raw = [r.get(label_col) for r in rows]
        labels = [_cell(value).strip() for value in raw]
        numbers = {label: value for label, value in zip(labels, raw)
                   if isinstance(value, int | float) and not isinstance(value, bool)}
        refuse_a_number_written_twice(numbers, f"{path}, column {label_col!r}")
        missing = [i for i, lab in enumerate(labels) if not lab]
        if missing:
            raise AttnlabError(f"{path}: {len(missing)} row(s) have no {label_col!r} label "
                               f"(first: {_row_name(path, missing[0])})")
    return Table(texts, labels, path, columns, text_column, label_col, numbers if label_col is not None else {})


def _refuse_twice(columns: list[str], column: str, path: Path) -> None:
    """A column the run reads must have its name once in the header: a CSV reader keeps the last of two without
    a word. (Other names may repeat, as the empty names of a spreadsheet's trailing cells do.)"""
    if columns.count(column) > 1:
        raise AttnlabError(f"{path}: the header names the column {column!r} {columns.count(column)} times; the "
                           "columns read need names of their own")


def _refuse_nested(rows: list[dict[str, object]], text_column: str, label_column: str | None, path: Path) -> None:
    """Refuse a JSON array or object in the text or label column: its JSON spelling would become the text, or a
    class of its own (``["billing", "refund"]``, a multi-label row, a third class beside the two)."""
    wanted = [(text_column, "text")]
    if label_column is not None:
        wanted.append((label_column, "one label: text, a number or true/false (multi-label rows are not supported)"))
    for i, row in enumerate(rows):
        for column, what in wanted:
            value = row.get(column)
            if isinstance(value, list | dict):
                kind = "an array" if isinstance(value, list) else "an object"
                raise AttnlabError(f"{path}: {_row_name(path, i)}: its {column!r} is {kind}; it must be {what}")


def _cell(value: object) -> str:
    """A cell as text: JSON numbers and booleans become their JSON spelling, a missing cell ''."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def refuse_a_number_written_twice(numbers: dict[str, int | float], where: str) -> None:
    """Refuse JSON labels that are one number written two ways (``1`` and ``1.0``), in one file or across the
    training and validation files (``where`` says which): they made two classes of one, and rows of the one
    counted as errors of the other. ``numbers``: each label that was a JSON number, and that number (compared
    exactly: distinct long ids stay distinct). Labels stay as read otherwise: a run trained on 1.0 predicts "1.0"."""
    spellings: dict[int | float, list[str]] = {}
    for label, value in numbers.items():
        spellings.setdefault(value, []).append(label)  # (1 and 1.0 are one key: equal, with one hash)
    for written in spellings.values():
        if len(written) > 1:
            first, second = (_short(label) for label in sorted(written)[:2])
            raise AttnlabError(f"{where}: the labels {first} and {second} are one number written two ways, which "
                               "would make two classes; write each label one way")


def _short(label: str, most: int = 40) -> str:
    """``label`` for a message: a very long one cut in the middle."""
    return label if len(label) <= most else f"{label[:most // 2]}...{label[-most // 2:]}"


def _row_name(path: Path, index: int) -> str:
    """A row's human number: the line of a JSON-lines file, the data row (after the header) of a CSV."""
    return f"row {index + 1}" if path.suffix.lower() in JSON_SUFFIXES else f"data row {index + 1}"


def check_classes(table: Table) -> list[str]:
    """The sorted label set of a training table; one class is an error (nothing to learn)."""
    assert table.labels is not None
    classes = sorted(set(table.labels))
    if len(classes) < 2:
        raise AttnlabError(f"{table.path}: the label column {table.label_column!r} holds one class only "
                           f"({classes[0]!r}); a classifier needs at least two")
    return classes


def split_off(table: Table, fraction: float, seed: int) -> tuple[Table, Table]:
    """Carve a validation table off ``table``: a random ``fraction`` of the rows, fixed by ``seed``.

    Returns:
        (training rows, validation rows), each in the file's order.
    """
    if not 0.0 < fraction < 1.0:
        raise AttnlabError(f"--valid-fraction must be between 0 and 1, got {fraction}")
    n_valid = round(len(table) * fraction)
    if n_valid < 1:
        raise AttnlabError(f"--valid-fraction {fraction:g} of {table.path}'s {len(table)} rows is less than one row: "
                           "nothing would be held out for validation")
    if n_valid >= len(table):
        raise AttnlabError(f"--valid-fraction {fraction:g} of {table.path}'s {len(table)} rows holds out all of "
                           "them: nothing would be left to train on")
    order = list(range(len(table)))
    random.Random(seed).shuffle(order)
    valid, train = sorted(order[:n_valid]), sorted(order[n_valid:])
    return (table.subset(train, f"{table.path} (training part)"),
            table.subset(valid, f"{table.path} (validation part)"))


#: Characters that would add a field or a line, or act on a terminal, or vanish: every control character and the
#: Unicode line and paragraph separators (which ``str.splitlines`` breaks at).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def one_line(value: str) -> str:
    """A text or label for one field of one line (a tab-separated column, a figure's tick label): tabs and line
    breaks written as ``\\t``, ``\\n``, ``\\r``, other control characters as ``\\x1b`` or ``\\u2028``, and a
    backslash as two, so that none adds a field or a line, acts on a terminal or disappears, and two values never
    look alike."""
    return _UNPRINTABLE.sub(_escaped, value.replace("\\", "\\\\"))


def _escaped(match: re.Match[str]) -> str:
    """One unprintable character as ``\\t`` (tab, line feed, return) or its code, ``\\x1b``, ``\\u2028``."""
    char = match.group()
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")
