"""Writing results: tables on the terminal (rich or plain text), CSV, Markdown.

CSV keeps raw values (milliseconds, bytes, ratios); the printed and Markdown tables show
memory in MiB and round everything for reading.
"""
from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path

from .measure import Table

MIB = 2**20


def columns(table: Table) -> list[str]:
    """All columns of the table's rows, in first-seen order."""
    return list(dict.fromkeys(k for row in table.rows for k in row))


def constants(table: Table) -> dict[str, object]:
    """Parameter columns with one value in every row (shown once, above the table)."""
    if len(table.rows) < 2:
        return {}
    first = table.rows[0]
    return {
        c: first[c]
        for c in columns(table)
        if not _is_figure(c) and all(row.get(c) == first.get(c) for row in table.rows)
    }


def display(table: Table) -> tuple[list[str], list[list[str]]]:
    """(headers, cells) for reading: constant parameters left out (see :func:`constants`),
    bytes as MiB, times with one or two decimals, ratios with two."""
    fixed = constants(table)
    cols = [c for c in columns(table) if c not in fixed]
    cells = [[_format(c, row.get(c)) for c in cols] for row in table.rows]
    return [_header(c) for c in cols], cells


def caption(table: Table) -> str:
    """The constant parameters as one line, e.g. ``batch=50, seq_len=50, backend=cpp``."""
    return ", ".join(f"{k}={_format(k, v)}" for k, v in constants(table).items())


def _is_figure(column: str) -> bool:
    figures = ("_ms", "_bytes", "_us_per_token", "_faults", "_per_s")
    return column.endswith(figures) or column.startswith(("time_", "mem_"))


def _header(column: str) -> str:
    for prefix, label in (("time_", "time"), ("mem_", "mem")):
        if column.startswith(prefix):
            return f"{label} {column[len(prefix):]}"
    for suffix, unit in (("_peak_bytes", "peak MiB"), ("_bytes", "MiB"), ("_ms", "ms"), ("_us_per_token", "us/token"),
                         ("_faults", "faults"), ("_chars_per_s", "chars/s")):
        if column.endswith(suffix):
            return f"{column[: -len(suffix)]} {unit}"
    return column


def _format(column: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if column.endswith("_bytes"):
        return f"{value / MIB:.2f}"
    if column.endswith("_per_s"):
        return f"{value:,.0f}"
    if isinstance(value, float):
        if column.endswith(("_ms", "_us_per_token")):
            return f"{value:.1f}" if value >= 10 else f"{value:.2f}"
        return f"{value:.3f}" if column == "gemm_gflop" else f"{value:.2f}"
    return str(value)


def write_csv(table: Table, out_dir: Path) -> Path:
    """``<out_dir>/<name>.csv`` with raw values; empty cells where a figure does not exist."""
    path = Path(out_dir) / f"{table.name}.csv"
    cols = columns(table)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=cols, restval="")
        writer.writeheader()
        for row in table.rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return path


def read_csv(path: Path, title: str = "") -> Table:
    """A Table back from a CSV of :func:`write_csv` (numbers parsed, empty cells dropped)."""
    path = Path(path)
    with path.open(newline="") as f:
        rows = [{k: _parse(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
    return Table(path.stem, title or path.stem, rows)


def _parse(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def markdown(table: Table) -> str:
    """The table as a Markdown section: title, notes, then the table."""
    headers, cells = display(table)
    lines = [f"### {table.title}", ""]
    lines += [f"- {note}" for note in [caption(table), *table.notes] if note]
    lines.append("")
    lines.append("| " + " | ".join(headers) + " |")
    lines.append("|" + "---|" * len(headers))
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines) + "\n"


def write_markdown(table: Table, out_dir: Path, header: Sequence[str] = ()) -> Path:
    """``<out_dir>/<name>.md``: the table with the lines describing its run (date, threads...)."""
    path = Path(out_dir) / f"{table.name}.md"
    run = f"\n*Run:* {'; '.join(header)}\n" if header else ""
    path.write_text(markdown(table) + run)
    return path


def write_results(out_dir: Path, order: Sequence[str] = ()) -> Path:
    """``<out_dir>/results.md``: every ``<name>.md`` there, ``order`` first, the rest by name.

    Built from the files, so a later run of one section (e.g. ``grid.enabled=false``)
    updates its part and keeps the others.
    """
    out_dir = Path(out_dir)
    found = {p.stem: p for p in out_dir.glob("*.md") if p.stem != "results"}
    names = [n for n in order if n in found] + sorted(set(found) - set(order))
    text = "# Benchmark results\n\n" + "\n".join(found[n].read_text() for n in names)
    path = out_dir / "results.md"
    path.write_text(text)
    return path


def plain_text(table: Table) -> str:
    """The table in aligned plain text."""
    headers, cells = display(table)
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    out = io.StringIO()
    out.write(f"{table.title}\n")
    for note in filter(None, [caption(table), *table.notes]):
        out.write(f"  {note}\n")
    out.write("  ".join(h.rjust(w) for h, w in zip(headers, widths)) + "\n")
    for row in cells:
        out.write("  ".join(c.rjust(w) for c, w in zip(row, widths)) + "\n")
    return out.getvalue()


def print_table(table: Table, style: str = "auto") -> None:
    """Print with rich (``style="rich"``, or ``"auto"`` when rich is installed) or plain text."""
    if style == "none":
        return
    if style in ("auto", "rich"):
        try:
            from rich.console import Console
            from rich.table import Table as RichTable
        except ImportError:
            if style == "rich":
                raise
        else:
            headers, cells = display(table)
            notes = [n for n in [caption(table), *table.notes] if n]
            rt = RichTable(title=table.title, caption="\n".join(notes) or None)
            for h in headers:
                rt.add_column(h, justify="right", overflow="fold")
            for row in cells:
                rt.add_row(*row)
            Console(width=max(120, 11 * len(headers))).print(rt)
            return
    print(plain_text(table), flush=True)

