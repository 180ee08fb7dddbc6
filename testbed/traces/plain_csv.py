"""Integer columns of a plain CSV file without pandas. The bundled length traces (sharegpt,
arxiv, bwb) are read before a run's first step, and importing pandas took longer than
reading them. A plain file is one pandas' reader takes cell by cell as written, so these
are the values it gives: UTF-8 without a byte-order mark, no quote, carriage return or NUL,
no blank line, every row as many cells as the header, distinct header names, and in the
columns read only decimal digits (at most 18: within int64) of at least `minimum`. Any
other file is not plain (None): the caller reads it with pandas, which also words its errors."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

_CELLS = re.compile(r"[0-9]{1,18}(?:\n[0-9]{1,18})*")  # a column's cells joined by newlines


def int_columns(path: Path, names: tuple[str, ...], minimum: int) -> list[np.ndarray] | None:
    """The columns `names` of the CSV at `path` as int64 arrays, or None when the file is not plain."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None
    if text.startswith("\ufeff") or any(c in text for c in '"\r\0'):
        return None
    lines = text.split("\n")
    if lines[-1] == "":  # the newline ending the last row
        lines.pop()
    if len(lines) < 2:  # no data row
        return None
    header = [h.strip() for h in lines[0].split(",")]  # the names as columns.read_csv strips them
    if len(set(header)) != len(header) or not set(names) <= set(header):
        return None
    commas = len(header) - 1
    if any(line.count(",") != commas for line in lines):
        return None
    flat = ",".join(lines[1:]).split(",")  # the data rows' cells, row after row
    out = []
    for name in names:
        cells = flat[header.index(name)::len(header)]
        if not _CELLS.fullmatch("\n".join(cells)):
            return None
        values = np.array(cells, dtype=np.int64)
        if values.min() < minimum:
            return None
        out.append(values)
    return out
