"""Parsing of quantities with units. (Solver integer units: formulations/pipeline.Resolution.)

Accepted spellings (case-insensitive, spaces ignored):

* durations: ``1.2s``, ``1200ms``, ``1.2s/step``, ``1200ms/step``, ``90us``, ``2min``
* money rates: ``40$/h``, ``40usd/h``, ``$40/h``, ``0.02$/step``
* memory: ``80GiB``, ``80GB`` (10^9 bytes), ``512MiB``, ``1TiB``
* bandwidth: ``25GB/s``, ``200Gbit/s``, ``100Gbps``
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from milp_plan.errors import InputError

SECONDS_PER_HOUR = 3600       # $/step = $/h x seconds per step / SECONDS_PER_HOUR
_NUM = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"

_TIME_UNITS_S = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "min": 60.0,
                 "h": float(SECONDS_PER_HOUR)}
_MEM_UNITS_BYTES = {
    "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_BW_UNITS_GB_PER_S = {"gb/s": 1.0, "gbyte/s": 1.0, "gbit/s": 0.125, "gbps": 0.125, "gb/sec": 1.0, "tb/s": 1000.0}

GIB = 2**30
TICKS_PER_SECOND = 1_000_000  # the coarsest solver tick (pipeline.Resolution picks finer ones)


def _clean(text: str) -> str:
    return str(text).strip().replace(" ", "").lower()


# Accepted ranges (in the base unit): a quantity outside is refused, naming the range.
DURATION_RANGE_S = (1e-6, 365 * 86400.0)     # 1 us .. 1 year
MONEY_MAX_USD = 1e9                          # per hour or per step; 0 is allowed
MEMORY_RANGE_BYTES = (1.0, 2.0**60)
BANDWIDTH_RANGE_GB_PER_S = (1e-6, 1e7)


def _split(text: str, what: str, example: str) -> tuple[float, str]:
    m = re.fullmatch(_NUM + r"(.*)", _clean(text).lstrip("$"))
    if not m:
        raise InputError(f"cannot read {what} '{_short(text)}'; write it like '{example}'")
    value = float(m.group(1))
    if not math.isfinite(value):
        raise InputError(f"'{_short(text)}' is not a finite number; write it like '{example}'", field=what)
    return value, m.group(2)


def _short(text: object) -> str:
    t = " ".join(str(text).split())
    return t if len(t) <= 40 else t[:37] + "..."


def _in_range(value: float, lo: float, hi: float, text: object, field: str, unit: str) -> float:
    if math.isfinite(value) and value <= 0 < lo:
        raise InputError(f"'{_short(text)}' must be > 0 (at least {lo:g} {unit})", field=field)
    if not math.isfinite(value) or not lo <= value <= hi:
        raise InputError(f"'{_short(text)}' is outside the accepted range {lo:g} to {hi:g} {unit}", field=field)
    return value


def check_duration_s(seconds: float, *, field: str = "time", text: object = None) -> float:
    """A duration in seconds within DURATION_RANGE_S (finite, > 0)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InputError(f"must be a duration in seconds, got {seconds!r}", field=field)
    return _in_range(float(seconds), *DURATION_RANGE_S, seconds if text is None else text, field, "s")


def check_money(money: "Money", *, field: str = "budget") -> "Money":
    if isinstance(money.usd, bool) or not isinstance(money.usd, (int, float)) or money.per not in ("h", "step"):
        raise InputError(f"must be dollars per h or per step, got {money!r}", field=field)
    _in_range(float(money.usd), 0.0, MONEY_MAX_USD, f"{money.usd}$/{money.per}", field, "$")
    return money


def parse_duration_s(text: str, *, field: str = "time") -> float:
    """'1.2s/step' | '1200ms' -> seconds (float), within DURATION_RANGE_S."""
    value, unit = _split(text, f"{field}", "1.2s/step")
    unit = unit.removesuffix("/step")
    if unit not in _TIME_UNITS_S:
        raise InputError(f"unknown time unit '{_short(unit)}' in '{_short(text)}'; use s, ms, us or min "
                         "(e.g. 1.2s/step)", field=field)
    return check_duration_s(value * _TIME_UNITS_S[unit], field=field, text=text)


@dataclass(frozen=True)
class Money:
    """A money amount per hour or per step, in US dollars."""

    usd: float
    per: str  # "h" or "step"


def parse_money(text: str, *, field: str = "budget") -> Money:
    """'40$/h' -> Money(40, 'h');  '0.02$/step' -> Money(0.02, 'step')."""
    raw = _clean(text)
    dollar_first = raw.startswith("$")
    value, unit = _split(raw, field, "40$/h or 0.02$/step")
    unit = unit.replace("usd", "$")
    if not dollar_first and not unit.startswith("$"):
        raise InputError(f"'{text}' has no currency; write it like '40$/h' or '0.02$/step'", field=field)
    unit = unit.lstrip("$")
    per = {"/h": "h", "/hour": "h", "/hr": "h", "/step": "step"}.get(unit)
    if per is None:
        raise InputError(f"'{text}' must be per hour or per step, like '40$/h' or '0.02$/step'", field=field)
    if value < 0:
        raise InputError(f"'{_short(text)}' must not be negative", field=field)
    return check_money(Money(value, per), field=field)


def parse_memory_bytes(text: str | int | float, *, field: str = "memory") -> float:
    """'80GiB' -> bytes. A bare number is taken as GiB. Within MEMORY_RANGE_BYTES."""
    if isinstance(text, bool):
        raise InputError(f"must be an amount of memory like '80GiB', got {text!r}", field=field)
    if isinstance(text, (int, float)):
        return _in_range(float(text) * GIB, *MEMORY_RANGE_BYTES, text, field, "bytes")
    value, unit = _split(text, field, "80GiB")
    if unit == "":
        return _in_range(value * GIB, *MEMORY_RANGE_BYTES, text, field, "bytes")
    if unit not in _MEM_UNITS_BYTES:
        raise InputError(f"unknown memory unit '{_short(unit)}' in '{_short(text)}'; use GiB, GB, MiB or TiB",
                         field=field)
    return _in_range(value * _MEM_UNITS_BYTES[unit], *MEMORY_RANGE_BYTES, text, field, "bytes")


def parse_bandwidth_gb_per_s(text: str | int | float, *, field: str = "bandwidth") -> float:
    """'25GB/s' | '200Gbit/s' -> GB/s (10^9 bytes per second). A bare number is GB/s."""
    if isinstance(text, bool):
        raise InputError(f"must be a bandwidth like '25GB/s', got {text!r}", field=field)
    if isinstance(text, (int, float)):
        return _in_range(float(text), *BANDWIDTH_RANGE_GB_PER_S, text, field, "GB/s")
    value, unit = _split(text, field, "25GB/s")
    if unit == "":
        return _in_range(value, *BANDWIDTH_RANGE_GB_PER_S, text, field, "GB/s")
    if unit not in _BW_UNITS_GB_PER_S:
        raise InputError(f"unknown bandwidth unit '{_short(unit)}' in '{_short(text)}'; use GB/s or Gbit/s",
                         field=field)
    return _in_range(value * _BW_UNITS_GB_PER_S[unit], *BANDWIDTH_RANGE_GB_PER_S, text, field, "GB/s")


def format_duration(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def format_duration_up(seconds: float) -> str:
    """`seconds` rounded up to 4 significant digits, as a duration option takes it ('1.306s',
    '10.01ms', '123.5us'; parse_duration_s reads it back): a limit that admits what it was read from."""
    unit, scale = ("s", 1.0) if seconds >= 1.0 else ("ms", 1e3) if seconds >= 1e-3 else ("us", 1e6)
    x = seconds * scale
    exp = math.floor(math.log10(x))
    q = 10.0 ** (exp - 3)
    return f"{math.ceil(x / q - 1e-9) * q:.{max(0, 3 - exp)}f}{unit}"


def format_gib(n_bytes: float) -> str:
    return f"{n_bytes / GIB:.2f} GiB"
