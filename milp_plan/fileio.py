"""Reading user files with errors that name the file, and writing outputs atomically."""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from milp_plan.errors import InputError


def read_text(path: str | Path, what: str = "file") -> str:
    p = Path(path)
    if not p.exists():
        raise InputError(f"{what} not found; check the path", source=str(p))
    if p.is_dir():
        raise InputError(f"expected a {what} but this is a directory", source=str(p))
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {what}: {exc}", source=str(p)) from None


def load_yaml(path: str | Path, what: str = "YAML file") -> Any:
    text = read_text(path, what)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise InputError(f"YAML syntax error{where}: {problem}; fix the syntax", source=str(path)) from None


def check_fields(data: Any, *, source: str, where: str, required: Iterable[str],
                 optional: Iterable[str] = ()) -> Mapping[str, Any]:
    """Require a mapping with exactly the known fields; name the first problem."""
    if not isinstance(data, Mapping):
        raise InputError(f"{where}: expected a mapping of fields, got {type(data).__name__}", source=source)
    required = list(required)
    known = set(required) | set(optional)
    for key in data:
        if key not in known:
            raise InputError(f"{where}: unknown field '{key}'; known fields are {', '.join(sorted(known))}",
                             source=source)
    for key in required:
        if key not in data or data[key] is None:
            raise InputError(f"{where}: missing required field '{key}'", source=source)
    return data


def number(data: Mapping[str, Any], key: str, *, source: str, where: str, integer: bool = False,
           positive: bool = True, allow_zero: bool = False, default: Any = None) -> Any:
    """Read a numeric field and check its sign; the error names the field and the fix."""
    value = data.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{where}: field '{key}' must be a number, got {value!r}", source=source)
    if integer and int(value) != value:
        raise InputError(f"{where}: field '{key}' must be a whole number, got {value!r}", source=source)
    if positive and (value < 0 or (value == 0 and not allow_zero)):
        bound = ">= 0" if allow_zero else "> 0"
        raise InputError(f"{where}: field '{key}' must be {bound}, got {value!r}", source=source)
    return int(value) if integer else float(value)


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def sha256_text(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write to a temporary file beside `path`, then rename: never a half-written output."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, mode, **({} if isinstance(data, bytes) else {"encoding": "utf-8"})) as fh:
            fh.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
