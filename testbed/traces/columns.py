"""Reading trace files (CSV, JSONL, Parquet) and checking their columns, row by row, with
errors that name the file, the row and the column."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .base import Source, TraceError


def read_csv(p: Path) -> tuple[pd.DataFrame, Source]:
    try:
        # only an empty cell is missing: "nan" or "NA" written in a cell is a value, and is
        # reported as written when it is not a number the column takes
        df = pd.read_csv(p, keep_default_na=False, na_values=[""])
    except pd.errors.EmptyDataError:
        raise TraceError(f"{p}: the file is empty (no header, no rows)") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        msg = " ".join(str(e).split())
        raise TraceError(f"{p}: not a readable CSV ({msg})") from None
    df.columns = [str(c).strip() for c in df.columns]
    return df, Source(str(p), "csv")


def read_jsonl(p: Path) -> tuple[pd.DataFrame, Source]:
    """One JSON object a line; blank lines are skipped (and not counted as rows). A byte-order
    mark at the start is accepted, as in a CSV."""
    records, lines = [], []
    with open(p, encoding="utf-8-sig") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line, parse_constant=str)  # NaN, Infinity: kept as written, not null
            except json.JSONDecodeError as e:
                raise TraceError(f"{p}, line {n}: invalid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise TraceError(f"{p}, line {n}: expected a JSON object, got {type(obj).__name__}")
            records.append(obj)
            lines.append(n)
    columns: dict[str, list] = {}
    for i, rec in enumerate(records):
        for key in rec:
            if key not in columns:
                columns[key] = [None] * len(records)
        for key, value in rec.items():
            columns[key][i] = value
    # dtypes are inferred per column: ints -> int64, ints with gaps -> float64 (NaN), else object
    df = pd.DataFrame({k: pd.Series(v) for k, v in columns.items()}, index=pd.RangeIndex(len(records)))
    return df, Source(str(p), "jsonl", tuple(lines))


def read_parquet(p: Path) -> tuple[pd.DataFrame, Source]:
    try:
        table = pq.read_table(p)
        df = table.to_pandas()
    except Exception as e:  # pyarrow raises several types for a broken file
        msg = " ".join(str(e).split())
        raise TraceError(f"{p}: not a readable Parquet file ({msg})") from None
    for name, col in zip(table.column_names, table.columns):  # NaN is a value, null is missing:
        if pa.types.is_floating(col.type) and pc.any(pc.is_nan(col)).as_py():  # pandas makes both NaN
            nan = pc.fill_null(pc.is_nan(col), False).to_numpy(zero_copy_only=False)
            df[name] = df[name].astype(object).where(~nan, "NaN")
    return df.reset_index(drop=True), Source(str(p), "parquet")


def read_table(p: Path) -> tuple[pd.DataFrame, Source]:
    suffix = p.suffix.lower()
    if suffix in (".csv", ".tsv"):
        return read_csv(p)
    if suffix in (".jsonl", ".json", ".ndjson"):
        return read_jsonl(p)
    if suffix in (".parquet", ".pq"):
        return read_parquet(p)
    raise TraceError(f"{p}: unknown file type {suffix!r}; use .csv, .jsonl or .parquet")


def ignored_columns(df: pd.DataFrame, known) -> list[str]:
    """A note naming the columns a format does not read (none: no note), so nothing in a
    file is passed over without a word."""
    other = [str(c) for c in df.columns if c not in known]
    return [f"columns not read by this format: {', '.join(other)}"] if other else []


def require(df: pd.DataFrame, src: Source, names: list[str]) -> None:
    for name in names:
        if name not in df.columns:
            present = ", ".join(map(str, df.columns)) or "none"
            raise TraceError(f"{src.path}: missing column '{name}' (columns present: {present})")
    if len(df) == 0:
        raise TraceError(f"{src.path}: no data rows")


def _show(value) -> str:
    if isinstance(value, np.generic):  # 12.5, True: not np.float64(12.5), np.True_
        value = value.item()
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "an empty value"
    text = repr(value)
    return f"value {text[:40] + '...' if len(text) > 40 else text}"


def int_column(df: pd.DataFrame, src: Source, name: str, minimum: int | None = None,
               optional_rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Column `name` as int64, every value an integer (integral floats are fine) and
    >= minimum. Rows where `optional_rows` is True may be empty. Returns (values, present)."""
    col = df[name]
    n = len(col)
    if pd.api.types.is_integer_dtype(col.dtype) and not col.hasnans:
        big = (col.abs() >= 2**62).to_numpy(bool) if n else np.zeros(0, bool)  # uint64 would wrap in int64
        if big.any():
            i = int(np.argmax(big))
            raise src.error(i, name, f"{_show(col.iloc[i])} is not an integer below 2**62")
        values = col.to_numpy(dtype=np.int64)
        present = np.ones(n, dtype=bool)
    else:
        if pd.api.types.is_bool_dtype(col.dtype):
            raise src.error(0, name, f"{_show(col.iloc[0])} is not an integer")
        if col.dtype == object:
            # a list, dict or bool must not pass as a number
            odd = col.map(lambda v: isinstance(v, (list, tuple, dict, bool, np.ndarray))).to_numpy(bool)
        else:
            odd = np.zeros(n, dtype=bool)
        num = pd.to_numeric(col.where(~odd, None), errors="coerce")
        asfloat = num.to_numpy(dtype=np.float64, na_value=np.nan)
        empty = col.isna().to_numpy(bool) & ~odd
        present = ~empty
        allowed_empty = empty if optional_rows is None else empty & optional_rows
        bad = (~np.isfinite(asfloat) | odd) & ~allowed_empty
        if optional_rows is None:
            bad |= empty
        with np.errstate(invalid="ignore"):
            bad |= np.isfinite(asfloat) & (asfloat != np.round(asfloat))
            bad |= np.abs(np.nan_to_num(asfloat)) >= 2.0**62
        if bad.any():
            i = int(np.argmax(bad))
            raise src.error(i, name, f"{_show(col.iloc[i])} is not an integer")
        values = np.where(present, np.nan_to_num(asfloat), 0).astype(np.int64)
    if minimum is not None:
        low = present & (values < minimum)
        if low.any():
            i = int(np.argmax(low))
            raise src.error(i, name, f"value {values[i]} is below the minimum {minimum}")
    return values, present


def seconds_column(df: pd.DataFrame, src: Source, name: str) -> np.ndarray:
    """Column `name` as float64 seconds: numbers as they are; datetimes as seconds since the
    earliest (Parquet timestamps, any unit or time zone); durations in seconds."""
    col = df[name]
    if pd.api.types.is_datetime64_any_dtype(col.dtype) or pd.api.types.is_timedelta64_dtype(col.dtype):
        if col.isna().any():
            raise src.error(int(np.argmax(col.isna().to_numpy())), name, "is empty (NaT)")
        span = col - col.min() if pd.api.types.is_datetime64_any_dtype(col.dtype) else col
        return span.dt.total_seconds().to_numpy(dtype=np.float64)
    return float_column(df, src, name)


def float_column(df: pd.DataFrame, src: Source, name: str) -> np.ndarray:
    """Column `name` as finite float64 (no empty values)."""
    col = df[name]
    if pd.api.types.is_bool_dtype(col.dtype):
        raise src.error(0, name, f"{_show(col.iloc[0])} is not a number")
    if col.dtype == object:
        odd = col.map(lambda v: isinstance(v, (list, tuple, dict, bool, np.ndarray))).to_numpy(bool)
        col = col.where(~odd, None)
    else:
        odd = np.zeros(len(col), dtype=bool)
    values = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(values) | odd
    if bad.any():
        i = int(np.argmax(bad))
        raise src.error(i, name, f"{_show(df[name].iloc[i])} is not a finite number")
    return values


def int_list(value, src: Source, i: int, name: str) -> np.ndarray | None:
    """One cell holding a list of ints: a list / array (JSONL, Parquet), or in CSV a string
    with a JSON list "[1, 2, 3]" or space-separated ints "1 2 3". Empty cell -> None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, str):
        text = value.strip()
        try:
            if text.startswith("["):
                items = json.loads(text)
            else:
                items = np.array(text.split(), dtype=np.int64)
        except (ValueError, OverflowError, json.JSONDecodeError):
            raise src.error(i, name, f"{_show(value)} is not a JSON list or space-separated ints") from None
    elif isinstance(value, (list, tuple, np.ndarray)):
        items = value
    elif isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        items = [value]  # a CSV cell with one id is read as a number
    elif isinstance(value, (float, np.floating)) and float(value).is_integer():
        items = [int(value)]
    else:
        raise src.error(i, name, f"{_show(value)} is not a list of ints")
    try:
        arr = np.asarray(items)
    except (ValueError, TypeError, OverflowError):
        raise src.error(i, name, "is not a flat list of ints") from None
    if arr.ndim != 1:
        raise src.error(i, name, "is not a flat list of ints")
    if arr.size == 0:
        return arr.astype(np.int64)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64)
    if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
        return arr.astype(np.int64)
    raise src.error(i, name, "holds a value that is not an integer")
