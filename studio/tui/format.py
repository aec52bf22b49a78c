"""How figures read in the UI: sizes, parameter counts, rates."""

from __future__ import annotations


def size(n: int | float | None) -> str:
    if n is None:
        return "—"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def count(n: int | float | None) -> str:
    """Parameter counts the way model cards write them: 13.2M, 1.1B."""
    if n is None:
        return "—"
    value = float(n)
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}"


def number(n: int | float | None, digits: int = 0) -> str:
    if n is None:
        return "—"
    return f"{n:,.{digits}f}"
