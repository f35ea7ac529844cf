"""Reading user files with errors that name the file, and writing outputs atomically.

The one place per file kind where input is parsed: `read_text` (regular files only, no
symlink loops), `load_yaml` (duplicate keys refused, depth bounded), `load_json` (NaN /
Infinity refused, depth bounded), `number` (every numeric field: finite, in range) and
`check_output` / `write_atomic` (outputs are regular files or stdout, checked before work).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from milp_plan.errors import InputError


MAX_INPUT_BYTES = 256 * 2**20   # a larger input file is refused, not read
MAX_NESTING = 64                # YAML / JSON nesting deeper than this is refused
FLOAT_MIN = 1e-9                # a positive float field below this is refused (e.g. 1e-300)
FLOAT_MAX = 1e12                # a float field above this is refused (e.g. 1e400 = inf)
INT_MAX = 2**31 - 1             # an integer field above this is refused unless the field says less


def resolve_input(path: str | Path, what: str = "file") -> Path:
    """The path of an existing regular file, or an InputError that says what is wrong with it
    (missing, a directory, a device or pipe, a symlink loop)."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        if p.is_symlink():
            raise InputError(f"{what} is a symbolic link to a missing file; fix the link", source=str(p)) from None
        raise InputError(f"{what} not found; check the path", source=str(p)) from None
    except RuntimeError:  # pragma: no cover - pathlib on older Pythons
        raise InputError(f"{what} is a symbolic link loop; fix the link", source=str(p)) from None
    except OSError as exc:
        import errno
        if exc.errno == errno.ELOOP:
            raise InputError(f"{what} is a symbolic link loop; fix the link", source=str(p)) from None
        raise InputError(f"cannot read {what}: {exc.strerror or exc}", source=str(p)) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"expected a {what} but this is a directory", source=str(p))
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"expected a {what} but this is not a regular file (a device, pipe or socket)",
                         source=str(p))
    if st.st_size > MAX_INPUT_BYTES:
        raise InputError(f"{what} is {st.st_size / 2**20:.0f} MiB, more than the {MAX_INPUT_BYTES // 2**20} MiB "
                         "limit on an input file", source=str(p))
    return p


def read_text(path: str | Path, what: str = "file") -> str:
    p = resolve_input(path, what)
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {what}: {' '.join(str(exc).split())}", source=str(p)) from None


def _depth(data: Any, limit: int = MAX_NESTING) -> int:
    """Nesting depth of parsed YAML/JSON data, iteratively (never a RecursionError); stops past `limit`."""
    stack, seen, deepest = [(data, 1)], set(), 0
    while stack:
        item, d = stack.pop()
        if not isinstance(item, (dict, list, tuple)) or id(item) in seen:
            continue
        seen.add(id(item))  # YAML aliases: each node once
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        stack.extend((v, d + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice (PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(None, None, "a mapping key must be a plain value",
                                                        key_node.start_mark) from None
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {seen[key].line + 1}); keep one",
                    key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


def parse_yaml(text: str, source: str) -> Any:
    """YAML text -> data: duplicate keys and nesting deeper than MAX_NESTING are input errors."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        kind = "YAML syntax error" if not isinstance(exc, yaml.constructor.ConstructorError) else "YAML error"
        raise InputError(f"{kind}{where}: {problem}; fix the syntax", source=source) from None
    except RecursionError:
        raise InputError(f"YAML nested too deeply (limit {MAX_NESTING} levels)", source=source) from None
    if _depth(data) > MAX_NESTING:
        raise InputError(f"YAML nested too deeply (limit {MAX_NESTING} levels)", source=source)
    return data


def load_yaml(path: str | Path, what: str = "YAML file") -> Any:
    return parse_yaml(read_text(path, what), str(path))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json(text: str, source: str) -> Any:
    """JSON text -> data: syntax errors, NaN/Infinity and nesting deeper than MAX_NESTING are input errors."""
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); JSON syntax error, "
                         "fix the syntax", source=source) from None
    except ValueError as exc:
        raise InputError(f"not valid JSON: {exc}; write a finite number", source=source) from None
    except RecursionError:
        raise InputError(f"JSON nested too deeply (limit {MAX_NESTING} levels)", source=source) from None
    if _depth(data) > MAX_NESTING:
        raise InputError(f"JSON nested too deeply (limit {MAX_NESTING} levels)", source=source)
    bad = _bad_number(data)
    if bad is not None:
        where, value = bad
        raise InputError(f"{value!r:.40} is not a finite number of at most 2^53 in magnitude; fix it",
                         source=source, field=where or "(top level)")
    return data


def _bad_number(data: Any) -> tuple[str, Any] | None:
    """(path, value) of the first number JSON cannot carry faithfully (1e400 read as inf, an
    integer beyond 2^53), iteratively."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, dict):
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(item))
        elif isinstance(item, float) and not math.isfinite(item):
            return path, item
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) > 2**53:
            return path, item
    return None


def load_json(path: str | Path, what: str = "JSON file") -> Any:
    return parse_json(read_text(path, what), str(path))


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
           positive: bool = True, allow_zero: bool = False, default: Any = None,
           maximum: float | None = None) -> Any:
    """Read a numeric field: a finite number of the right kind, sign and range (integers up to
    `maximum` or INT_MAX; floats in [FLOAT_MIN, `maximum` or FLOAT_MAX] in magnitude, or 0 where
    allowed). The error names the field and the fix."""
    value = data.get(key, default)
    if value is None:
        return None
    return check_number(value, key, source=source, where=where, integer=integer, positive=positive,
                        allow_zero=allow_zero, maximum=maximum)


def check_number(value: Any, key: str, *, source: str | None, where: str, integer: bool = False,
                 positive: bool = True, allow_zero: bool = False, maximum: float | None = None) -> Any:
    """`number` for a value already read (see there)."""
    def bad(why: str) -> InputError:
        return InputError(f"{where}: field '{key}' {why}, got {_show(value)}", source=source)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad("must be a number")
    if not math.isfinite(value):
        raise bad("must be a finite number")
    if integer and int(value) != value:
        raise bad("must be a whole number")
    if positive and (value < 0 or (value == 0 and not allow_zero)):
        raise bad("must be >= 0" if allow_zero else "must be > 0")
    top = maximum if maximum is not None else (INT_MAX if integer else FLOAT_MAX)
    if abs(value) > top:
        raise bad(f"must be at most {int(top) if integer else top:{',' if integer else 'g'}} (a limit of milp-plan)")
    if not integer and value != 0 and abs(value) < FLOAT_MIN:
        raise bad(f"must be 0 or at least {FLOAT_MIN:g} in magnitude")
    return int(value) if integer else float(value)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def sha256_text(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_output(path: str | Path, what: str = "output", *, allow_stdout: bool = True) -> None:
    """Before any work: an output is '-' (stdout) or a regular file (existing or new) in a
    directory we may write; a device, pipe, directory or unwritable place is an InputError."""
    if allow_stdout and str(path) == "-":
        return
    p = Path(path)
    field = f"--out {path}" if what == "output" else what
    try:
        st = p.stat() if (p.exists() or p.is_symlink()) else None
    except OSError as exc:
        raise InputError(f"cannot use this path: {exc.strerror or exc}; choose another", source=str(p),
                         field=field) from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise InputError("is a directory; give a file name", source=str(p), field=field)
        if not stat.S_ISREG(st.st_mode):
            raise InputError("is not a regular file (a device, pipe or socket) and would be replaced; give a file "
                             "name" + (" or '-' for stdout" if allow_stdout else ""), source=str(p), field=field)
        if not os.access(p, os.W_OK):
            raise InputError("is not writable; choose another path or fix its permissions", source=str(p),
                             field=field)
    parent = p.parent
    while not parent.exists():  # write_atomic creates missing directories: the first existing one decides
        if parent == parent.parent:
            break
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"cannot write into directory '{parent}'; choose another path", source=str(p), field=field)


def write_output(path: str | Path, data: str) -> None:
    """`write_atomic`, or stdout when `path` is '-'."""
    if str(path) == "-":
        sys.stdout.write(data)
        sys.stdout.flush()
        return
    write_atomic(path, data)


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write to a temporary file beside `path`, then rename: never a half-written output.
    A path that exists and is not a regular file (a device, a pipe) is never replaced."""
    p = Path(path)
    if p.exists() and not p.is_file():
        raise InputError("exists and is not a regular file; it is left alone; give a file name", source=str(p))
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
