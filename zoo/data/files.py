"""Reading data files with checks: CSV tables (pandas) and files of whitespace-separated numbers.

Each reader checks what it reads before any split or standardisation and raises
:class:`~zoo.data.checks.DataError` naming the file, the 1-based file line
(:class:`~zoo.data.checks.FileLines`), the column and what to do.
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from zoo.data.checks import DataError, FileLines, check_file, check_table, listing

__all__ = ["CsvTable", "read_csv_table", "read_numbers"]

_CSV_CONTENT = "a header line of column names and one line per example"


@dataclass
class CsvTable:
    """A CSV file read by :func:`read_csv_table`: its path, a name for messages, the frame and its lines."""

    path: Path
    source: str
    frame: pd.DataFrame
    lines: FileLines

    @property
    def columns(self) -> list[str]:
        """Column names, as in the header."""
        return [str(c) for c in self.frame.columns]

    def numeric(self, columns: list[str]) -> np.ndarray:
        """float64 ``[N, len(columns)]`` of the named columns, checked with :func:`~zoo.data.checks.check_table`.

        A cell that is not a number raises :class:`DataError` naming its line, column and text.
        """
        frame = self.frame[columns]
        text = [c for c in columns if not pd.api.types.is_numeric_dtype(frame[c])]
        if text:
            coerced = {c: pd.to_numeric(frame[c], errors="coerce") for c in text}
            bad = {c: np.flatnonzero((coerced[c].isna() & frame[c].notna()).to_numpy()) for c in text}
            bad = {c: rows for c, rows in bad.items() if rows.size}
            if bad:
                column, rows = min(bad.items(), key=lambda item: item[1][0])
                raise DataError(
                    f"{self.source} line {self.lines([rows[0]])[0]} column {column!r} holds "
                    f"{_quoted(str(frame[column].iloc[rows[0]]))}, not a number ({self.lines.note}); non-numeric "
                    f"cells are in column(s) {listing(bad)}: fix those cells, or encode or drop the columns."
                )
            frame = frame.assign(**coerced)
        values = frame.to_numpy(dtype=np.float64)
        check_table(values, self.source, columns, self.lines)
        return values


def _first_wide_line(path: Path, n_names: int) -> int | None:
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as handle:
        reader, start = csv.reader(handle), 1
        try:
            for record in reader:
                if len(record) > n_names:
                    return start
                start = reader.line_num + 1
        except csv.Error:  # e.g. a field beyond the csv module's size limit
            return None
    return None


#: bytes of a data file looked at for binary content, and the longest cell text quoted in a message
_SNIFF_BYTES = 1 << 16
_QUOTED_CHARS = 60
#: bytes that no text file holds (control characters other than tab, line feed, form feed, carriage return)
_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0e-\x1f]")


def _check_text(path: Path, source: str, content: str, kind: str = "text file") -> None:
    """:class:`DataError` for a file that is not text (a control byte, or not UTF-8, in its first 64 KiB)."""
    with open(path, "rb") as handle:
        head = handle.read(_SNIFF_BYTES)
    control = _CONTROL.search(head)
    if control:
        raise DataError(f"{source} is not a {kind} (control byte {control.group()[0]:#04x} at offset "
                        f"{control.start()}: binary data); it should hold {content}.")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(head) - 4:  # not a character cut at the end of the sniffed block
            raise DataError(f"{source} is not UTF-8 text (byte {head[err.start]:#04x} at offset {err.start}); it "
                            f"should hold {content}, saved as UTF-8.") from None


def _quoted(text: str) -> str:
    """``text`` quoted for a message, shortened when long (a cell may hold millions of characters)."""
    if len(text) <= _QUOTED_CHARS:
        return repr(text)
    return f"{text[:_QUOTED_CHARS]!r}... ({len(text)} characters)"


def read_csv_table(path, what: str = "CSV file") -> CsvTable:
    """Read a CSV file with a header line (``pandas.read_csv`` defaults) and check its layout.

    Checks: the file exists, is not a directory and is not empty; no column name appears twice
    in the header (pandas would silently rename the copy ``name.1``); no data line has more
    fields than the header (pandas would take the first fields as row labels); at least one
    data row. Cell values are checked by :meth:`CsvTable.numeric`.
    """
    path = check_file(path, what, _CSV_CONTENT)
    source = f"{what} {path}"
    _check_text(path, source, _CSV_CONTENT, "text CSV file")
    try:
        header = pd.read_csv(path, header=None, nrows=1, dtype=str, keep_default_na=False).iloc[0].tolist()
        frame = pd.read_csv(path)
    except pd.errors.EmptyDataError as err:
        raise DataError(f"{source} holds no header line; it should hold {_CSV_CONTENT}.") from err
    except (pd.errors.ParserError, UnicodeDecodeError) as err:
        raise DataError(f"could not parse {source}: {str(err).strip().splitlines()[0]}") from err
    repeated = [name for name, count in Counter(header).items() if count > 1 and name.strip()]
    if repeated:
        name = repeated[0]
        positions = [i for i, h in enumerate(header) if h == name]
        copies = [str(frame.columns[i]) for i in positions[1:] if i < len(frame.columns)]
        raise DataError(
            f"{source}: column name {name!r} appears {len(positions)} times in the header (columns "
            f"{', '.join(str(i + 1) for i in positions[:-1])} and {positions[-1] + 1}, 1-based), and pandas "
            f"would read the copies as separate columns {copies}; rename or drop the duplicate column(s)."
        )
    if frame.index.nlevels > 1 or not frame.index.equals(pd.RangeIndex(len(frame))):
        line = _first_wide_line(path, len(header))
        raise DataError(
            f"{source} line {line} has more fields than the {len(header)} column names of the header (line 1); "
            "add the missing column names or remove the extra fields (e.g. trailing commas)."
        )
    if len(frame) == 0:
        raise DataError(f"{source} has a header line but no data rows; it should hold {_CSV_CONTENT}.")
    return CsvTable(path, source, frame, FileLines(path, "csv", len(frame)))


def _explain_bad_text(path: Path) -> str | None:
    """The first line of a whitespace-separated number file that ``numpy.loadtxt`` cannot read, said why."""
    width = first = None
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, 1):
            fields = line.split("#")[0].split()
            for column, field in enumerate(fields, 1):
                try:
                    float(field)
                except ValueError:
                    return f"line {number} field {column} is {field!r}, not a number"
            if fields and width is None:
                width, first = len(fields), number
            elif fields and len(fields) != width:
                return f"line {number} has {len(fields)} fields but line {first} has {width}"
    return None


def read_numbers(path, what: str, content: str, ndmin: int = 1) -> tuple[np.ndarray, FileLines]:
    """A file of whitespace-separated numbers (``numpy.loadtxt``; ``#`` comments and blank lines skipped).

    Returns the float64 array (at least ``ndmin``-D, one row per data line) and the
    :class:`FileLines` of its rows. ``what`` names the file in messages, ``content`` says what
    it should hold; a file without numbers or with a text or missing field raises :class:`DataError`
    naming the line.
    """
    path = check_file(path, what, content)
    _check_text(path, f"{what} {path}", content)
    with open(path, encoding="utf-8", errors="replace") as handle:
        if not any(line.split("#")[0].strip() for line in handle):
            raise DataError(f"{what} {path} holds no numbers; it should hold {content}.")
    try:
        values = np.loadtxt(path, ndmin=ndmin)
    except ValueError as err:
        reason = _explain_bad_text(path) or str(err).splitlines()[0]
        raise DataError(
            f"{what} {path}: {reason} (lines are 1-based); it should hold {content}, whitespace-separated."
        ) from err
    return values, FileLines(path, "text", values.shape[0] if values.ndim > 1 else values.size)
