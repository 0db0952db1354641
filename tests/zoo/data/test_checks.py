"""Data checked before it is trusted: each data error of the CSV and UCI loaders, with its message.

Every case is raised by the loader (``DataError``, naming the file, the 1-based file line and
the column) and, through ``lab.cli.main``, exits with status 2 and that message as one line.
CSV lines count the header as line 1; the UCI ``data.txt`` written here starts with a comment
line and a blank line, so its 0-based row ``r`` is on file line ``r + 3``.
"""

from pathlib import Path

import numpy as np
import pytest

from lab.cli import main
from zoo.data import DataError, load_csv, load_uci
from zoo.data.checks import FileLines

# ---------------------------------------------------------------------------------- builders


def _csv_text(n=8, cells=None, header="a,b,y"):
    """A CSV text: ``n`` data rows of 3 numbers (data row ``r`` on line ``r + 2``), ``cells`` {(r, c): text}."""
    rows = [[str(r + 1), str(2 * r + 1), str((r * 7) % 5 + 0.5)] for r in range(n)]
    for (r, c), text in (cells or {}).items():
        rows[r][c] = text
    return "\n".join([header] + [",".join(row) for row in rows]) + "\n"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


TEST_ROWS = [14, 20, 21, 22, 23]


def _uci(folder: Path, cell=None, train=None, test=None, target_value=None, target_rows=None) -> Path:
    """A UCI-layout folder: 30 rows x 5 columns (col1 constant, target col3), one split, ``TEST_ROWS`` tested.

    ``cell`` = (row, column, text) replaces one field of data.txt; ``target_value`` sets the
    target column to that value in ``target_rows`` (default all rows).
    """
    folder.mkdir()
    rng = np.random.default_rng(1)
    data = rng.normal(size=(30, 5)) * [1, 0, 2, 3, 4] + [0, 7, 1, 10, -5]
    if target_value is not None:
        data[slice(None) if target_rows is None else target_rows, 3] = target_value
    rows = [[f"{v:.6f}" for v in row] for row in data]
    if cell is not None:
        rows[cell[0]][cell[1]] = cell[2]
    (folder / "data.txt").write_text("\n".join(["# generated for a test", ""] + [" ".join(r) for r in rows]) + "\n")
    (folder / "index_features.txt").write_text("0\n1\n2\n")
    (folder / "index_target.txt").write_text("3\n")
    (folder / "n_splits.txt").write_text("1\n")
    test = TEST_ROWS if test is None else test
    train = [r for r in range(30) if r not in test] if train is None else train
    (folder / "index_train_0.txt").write_text("".join(f"{r}\n" for r in train))
    (folder / "index_test_0.txt").write_text("".join(f"{r}\n" for r in test))
    return folder


# ---------------------------------------------------------------------------------- cases

# id -> (build(tmp_path) -> (dataset spec, loader call), regex of the message)
CASES = {
    "csv duplicate target name": (
        lambda tmp: _csv_case(tmp, _csv_text(header="a,y,y"), "y"),
        r"t\.csv: column name 'y' appears 2 times in the header \(columns 2 and 3, 1-based\), and pandas "
        r"would read the copies as separate columns \['y\.1'\]; rename or drop",
    ),
    "csv path is a directory": (
        lambda tmp: (f"csv:{tmp}:y", lambda: load_csv(tmp, "y")),
        r"^CSV file .* is a directory, not a file; give the path of the file itself\.$",
    ),
    "csv empty file": (
        lambda tmp: _csv_case(tmp, "", "y"),
        r"t\.csv is empty; it should hold a header line of column names and one line per example\.$",
    ),
    "csv header without rows": (
        lambda tmp: _csv_case(tmp, "a,b,y\n", "y"),
        r"t\.csv has a header line but no data rows",
    ),
    "csv missing target column": (
        lambda tmp: _csv_case(tmp, _csv_text(), "z"),
        r"target column\(s\) \['z'\] not found in .*t\.csv; available columns: \['a', 'b', 'y'\]\.$",
    ),
    "csv non-numeric cell": (
        lambda tmp: _csv_case(tmp, _csv_text(cells={(4, 1): "seven"}), "y"),
        r"t\.csv line 6 column 'b' holds 'seven', not a number \(lines are 1-based, the header is line 1\); "
        r"non-numeric cells are in column\(s\) \[b\]",
    ),
    "csv missing and NaN/inf cells after a blank line": (
        lambda tmp: _csv_case(tmp, _csv_text(cells={(2, 1): ""}).replace("\n", "\n\n", 2) + "9,9,inf\n", "y"),
        r"t\.csv has 2 missing or NaN/inf value\(s\): line 6 column 'b' \(nan\), line 12 column 'y' \(inf\) "
        r"\(lines are 1-based, the header is line 1\); fill in or drop",
    ),
    "csv value overflowing float32": (
        lambda tmp: _csv_case(tmp, _csv_text(cells={(1, 0): "1e300"}), "y"),
        r"t\.csv has 1 value\(s\) beyond the float32 range \(±3\.4e\+38\) that the models compute in: "
        r"line 3 column 'a' \(1e\+300\) \(lines are 1-based, the header is line 1\); rescale",
    ),
    "csv constant target": (
        lambda tmp: _csv_case(tmp, _csv_text(cells={(r, 2): "3" for r in range(8)}), "y"),
        r"t\.csv: target column\(s\) 'y' \(always 3\) hold a single value in all 8 data rows; a regression "
        r"target must vary",
    ),
    "csv rows wider than the header": (
        lambda tmp: _csv_case(tmp, _csv_text(header="a,b"), "b"),
        r"t\.csv line 2 has more fields than the 2 column names of the header \(line 1\)",
    ),
    "csv row with an extra field": (
        lambda tmp: _csv_case(tmp, _csv_text(cells={(2, 2): "1,2"}), "y"),
        r"^could not parse CSV file .*t\.csv: Error tokenizing data\. C error: Expected 3 fields in line 4, saw 4$",
    ),
    "uci NaN in data.txt row that lands in the test split": (
        lambda tmp: _uci_case(_uci(tmp / "u", cell=(14, 2, "nan"))),
        r"UCI file .*data\.txt has 1 missing or NaN/inf value\(s\): line 17 column 'col2' \(nan\) "
        r"\(lines are 1-based, no header\)",
    ),
    "uci value overflowing float32 in the test split": (
        lambda tmp: _uci_case(_uci(tmp / "u", cell=(20, 0, "-1e300"))),
        r"data\.txt has 1 value\(s\) beyond the float32 range .*: line 23 column 'col0' \(-1e\+300\) "
        r"\(lines are 1-based, no header\); rescale",
    ),
    "uci non-numeric cell": (
        lambda tmp: _uci_case(_uci(tmp / "u", cell=(14, 2, "abc"))),
        r"data\.txt: line 17 field 3 is 'abc', not a number \(lines are 1-based\)",
    ),
    "uci row with a missing field": (
        lambda tmp: _uci_case(_uci(tmp / "u", cell=(14, 2, ""))),
        r"data\.txt: line 17 has 4 fields but line 3 has 5",
    ),
    "uci test rows overlapping the training rows": (
        lambda tmp: _uci_case(_uci(tmp / "u", train=list(range(3, 30)), test=[0, 1, 2, 7, 12])),
        r"index_train_0\.txt and index_test_0\.txt share 2 row index\(es\) \[7, 12\] \(0-based rows of "
        r"data\.txt, at its lines \[10, 15\]\); a row must not be in both",
    ),
    "uci row listed twice in one split file": (
        lambda tmp: _uci_case(_uci(tmp / "u", train=[0, 1, 5, 2, 5, 3])),
        r"index_train_0\.txt lists training rows more than once: \[5 at lines 3, 5\]; each may appear once",
    ),
    "uci index out of range": (
        lambda tmp: _uci_case(_uci(tmp / "u", test=[0, 30, 2])),
        r"index_test_0\.txt must list integer test rows in 0\.\.29; found \[30 at line 2\]",
    ),
    "uci constant target": (
        lambda tmp: _uci_case(_uci(tmp / "u", target_value=4.5)),
        r"data\.txt: target column\(s\) 'col3' \(always 4\.5\) hold a single value in all 30 rows",
    ),
    "uci target constant over the training rows": (
        lambda tmp: _uci_case(_uci(tmp / "u", target_value=4.5, target_rows=np.setdiff1d(range(30), TEST_ROWS))),
        r"index_train_0\.txt: target column\(s\) 'col3' \(always 4\.5\) hold a single value in all 25 training rows",
    ),
    "uci empty data.txt": (
        lambda tmp: _uci_case(_blank_data(_uci(tmp / "u"), "")),
        r"data\.txt is empty; it should hold one line of whitespace-separated numbers per example\.$",
    ),
    "uci data.txt of comments only": (
        lambda tmp: _uci_case(_blank_data(_uci(tmp / "u"), "# nothing here\n\n")),
        r"data\.txt holds no numbers",
    ),
    "uci data.txt is a directory": (
        lambda tmp: _uci_case(_blank_data(_uci(tmp / "u"), None)),
        r"data\.txt is a directory, not a file",
    ),
}


def _csv_case(tmp: Path, text: str, target: str):
    path = _write(tmp / "t.csv", text)
    return f"csv:{path}:{target}", lambda: load_csv(path, target)


def _uci_case(folder: Path):
    return f"uci:{folder}", lambda: load_uci(folder, split=0)


def _blank_data(folder: Path, text):
    """Replace data.txt by ``text``, or by a directory when ``text`` is None."""
    (folder / "data.txt").unlink()
    if text is None:
        (folder / "data.txt").mkdir()
    else:
        (folder / "data.txt").write_text(text)
    return folder


@pytest.mark.parametrize("case", list(CASES))
def test_data_error_names_file_line_and_column_and_cli_exits_2(case, tmp_path, capsys):
    build, pattern = CASES[case]
    spec, load = build(tmp_path)
    with pytest.raises(DataError, match=pattern) as err:
        load()
    message = str(err.value)
    assert "\n" not in message
    code = main(["fit", "--data", spec, "--quiet", "--epochs", "1", "--out", str(tmp_path / "run")])
    assert code == 2
    assert capsys.readouterr().err.strip() == f"error: {message}"
    assert not (tmp_path / "run").exists()


def test_valid_files_with_comments_blank_lines_and_quotes_load(tmp_path):
    """The layouts the line counting allows for (comments, blank lines, a quoted field over two lines) load."""
    ds = load_uci(_uci(tmp_path / "u"), split=0)
    assert (ds.n_train, ds.n_test) == (25, 5)
    text = _csv_text().replace("\n", "\n\n", 2)
    path = _write(tmp_path / "q.csv", text.replace("a,b,y", 'a,"b\nsecond line",y'))
    assert load_csv(path, "y").feature_names == ["a", "b\nsecond line"]


def test_file_lines_fall_back_to_data_row_numbers_when_the_scan_disagrees(tmp_path):
    path = _write(tmp_path / "t.csv", _csv_text(n=3).replace("\n", "\n\n", 2))
    assert FileLines(path, "csv", 3)([0, 2]) == [3, 6] and "header is line 1" in FileLines(path, "csv", 3).note
    other = FileLines(path, "csv", 4)  # not the number of rows the scan finds
    assert other([0, 2]) == [1, 3] and other.note == "rows are counted 1-based from the first data row"
    text = _write(tmp_path / "d.txt", "# c\n1 2\n\n3 4 # x\n")
    assert FileLines(text, "text", 2)([0, 1]) == [2, 4]
