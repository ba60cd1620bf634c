"""Reading a suite result file (``kvpilot bench tuner --suite --json``) back for the plots.

The file is input like any other: it may be hand-edited, truncated, from another version, or not JSON at all.
Every row is checked for what the plots read before one figure is drawn, so a bad file gets one line that names
the file and the field (and what must hold) instead of a traceback half-way through a figure.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

# A case names its SVG file: no path separators, no leading dot (``../x`` must not write outside the folder).
CASE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
SERIES_NUMBERS = ("t", "offered", "limit")
SERIES_OPTIONAL_NUMBERS = ("kv", "ttftP95", "tpotP95", "attainment", "active")


class SuiteFileError(ValueError):
    """A suite file that cannot be plotted; the message names the file and the field."""


def load_suite_rows(path: Path) -> list[dict[str, Any]]:
    """The ``cases`` of the suite JSON at ``path``, each checked for the fields the plots read."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SuiteFileError(f"{path}: cannot read the suite file: {getattr(exc, 'strerror', None) or exc}") from None
    if not text.strip():
        raise SuiteFileError(f"{path}: the file is empty; it must hold the JSON object of "
                             "`kvpilot bench tuner --suite --json`")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SuiteFileError(f"{path}: not JSON ({exc}); it must hold the JSON object of "
                             "`kvpilot bench tuner --suite --json`") from None
    return suite_rows(doc, str(path))


def suite_rows(doc: Any, source: str) -> list[dict[str, Any]]:
    """``doc['cases']`` when every row has what the plots read; else SuiteFileError naming the field."""
    if not isinstance(doc, dict):
        raise SuiteFileError(f"{source}: must be a JSON object with a 'cases' list, got {_kind(doc)}")
    cases = doc.get("cases")
    if not isinstance(cases, list):
        raise SuiteFileError(f"{source}: 'cases' must be a list of case results, got {_kind(cases)}")
    for n, row in enumerate(cases):
        _check_row(row, f"{source}: cases[{n}]")
    return cases


def _check_row(row: Any, where: str) -> None:
    _mapping(row, where)
    case = row.get("case")
    if not isinstance(case, str) or not CASE_NAME.fullmatch(case):
        raise SuiteFileError(f"{where}.case must be a name of letters, digits, '.', '_' or '-' (it names the SVG "
                             f"file), got {case!r}")
    _text(row, "profile", where)
    _number(_mapping(row.get("ratios"), f"{where}.ratios"), "overOracle", f"{where}.ratios")
    _check_tuned(_mapping(row.get("autotuned"), f"{where}.autotuned"), f"{where}.autotuned")
    if row.get("autotunedFrom2048") is not None:
        _check_tuned(_mapping(row["autotunedFrom2048"], f"{where}.autotunedFrom2048"), f"{where}.autotunedFrom2048")


def _check_tuned(tuned: dict[str, Any], where: str) -> None:
    """One tuned run: goodput, changes, the applied history, and optionally its verifications, canaries and
    time series."""
    _number(tuned, "goodput", where)
    _number(tuned, "changes", where)
    history = tuned.get("history")
    if not isinstance(history, list):
        raise SuiteFileError(f"{where}.history must be a list of changes, got {_kind(history)}")
    for i, change in enumerate(history):
        at = f"{where}.history[{i}]"
        _number(_mapping(change, at), "atSeconds", at)
        _number(change, "to", at)
        if not isinstance(change.get("rollback", False), bool):
            raise SuiteFileError(f"{at}.rollback must be true or false, got {_kind(change.get('rollback'))}")
    for key, times in (("verifications", ("atSeconds",)), ("canaries", ("startSeconds",))):
        marks = tuned.get(key, [])
        if not isinstance(marks, list):
            raise SuiteFileError(f"{where}.{key} must be a list, got {_kind(marks)}")
        for i, mark in enumerate(marks):
            at = f"{where}.{key}[{i}]"
            for name in times:
                _number(_mapping(mark, at), name, at)
            _number(mark, "endSeconds", at, optional=True)
            if not isinstance(mark.get("outcome") or "", str):
                raise SuiteFileError(f"{at}.outcome must be a string or null, got {_kind(mark.get('outcome'))}")
    series = tuned.get("series")
    if series is None:
        return  # a suite run without --json has no series: the figure shows the changes only
    if not isinstance(series, list):
        raise SuiteFileError(f"{where}.series must be a list of points, got {_kind(series)}")
    for i, point in enumerate(series):
        at = f"{where}.series[{i}]"
        _mapping(point, at)
        for key in SERIES_NUMBERS:
            _number(point, key, at)
        for key in SERIES_OPTIONAL_NUMBERS:
            _number(point, key, at, optional=True)
        in_force = point.get("inForce")
        if in_force is not None and not (isinstance(in_force, list) and all(_is_number(v) for v in in_force)):
            raise SuiteFileError(f"{at}.inForce must be a list of numbers or null, got {in_force!r:.80}")


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SuiteFileError(f"{where} must be a JSON object, got {_kind(value)}")
    return value


def _text(doc: dict[str, Any], key: str, where: str) -> None:
    if not isinstance(doc.get(key), str):
        raise SuiteFileError(f"{where}.{key} must be a string, got {_kind(doc.get(key))}")


def _number(doc: dict[str, Any], key: str, where: str, optional: bool = False) -> None:
    value = doc.get(key)
    if optional and value is None:
        return
    if not _is_number(value):
        what = "a number or null" if optional else "a number"
        raise SuiteFileError(f"{where}.{key} must be {what}, got {_kind(value)}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    """What was found, briefly: the JSON type, and the value when it is a short scalar."""
    if value is None:
        return "nothing (missing or null)"
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
             float: "a number"}
    name = names.get(type(value), type(value).__name__)
    return f"{name} {value!r:.40}" if isinstance(value, (str, int, float)) else name
