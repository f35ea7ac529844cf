"""Quantities with units: every expected value is the unit conversion written out by hand."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from milp_plan.errors import InputError
from milp_plan.units import (GIB, Money, format_duration, format_duration_up, format_gib, parse_bandwidth_gb_per_s,
                             parse_duration_s, parse_memory_bytes, parse_money)


# ---- durations ------------------------------------------------------------------------
@pytest.mark.parametrize("text, seconds", [
    ("1.2s/step", 1.2),
    ("1200ms/step", 1.2),          # 1200 x 1e-3
    ("1200ms", 1.2),
    ("90us", 90e-6),               # 90 x 1e-6
    ("2min", 120.0),               # 2 x 60
    ("1.5 s", 1.5),                # spaces ignored
    ("30S", 30.0),                 # case ignored
    ("1e-3s", 1e-3),
    ("0.5h", 1800.0),              # 0.5 x 3600
])
def test_parse_duration(text, seconds):
    assert parse_duration_s(text) == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize("seconds, text", [
    (1.30573, "1.306s"),     # up, not to the nearest
    (1.3053, "1.306s"),
    (1.306, "1.306s"),       # already 4 digits: itself
    (0.0123456, "12.35ms"),
    (0.9999, "999.9ms"),
    (123.4, "123.4s"),
    (0.000123451, "123.5us"),
])
def test_format_duration_up(seconds, text):
    assert format_duration_up(seconds) == text


@given(st.floats(min_value=1e-6, max_value=1e5))
def test_format_duration_up_admits_what_it_was_read_from(seconds):
    """The suggested --time-limit is read back at or above the step it came from (within the
    float noise the limit check allows, 1e-6), and within 4 significant digits of it."""
    back = parse_duration_s(format_duration_up(seconds) + "/step")
    assert seconds * (1 - 1e-9) <= back <= seconds * (1 + 1.001e-3)


@pytest.mark.parametrize("text", ["1.2parsecs", "1.2", "fast", "s", "1.2s/epoch", ""])
def test_parse_duration_rejects(text):
    with pytest.raises(InputError) as err:
        parse_duration_s(text, field="time-limit")
    assert "time-limit" in str(err.value) or "1.2s/step" in str(err.value)
    assert "\n" not in str(err.value)


def test_parse_duration_error_names_field_and_unit():
    with pytest.raises(InputError) as err:
        parse_duration_s("1.2parsecs", field="time-limit")
    msg = str(err.value)
    assert "field 'time-limit'" in msg and "parsecs" in msg and "1.2s/step" in msg


# ---- money ------------------------------------------------------------------------------
@pytest.mark.parametrize("text, usd, per", [
    ("40$/h", 40.0, "h"),
    ("$40/h", 40.0, "h"),
    ("40usd/h", 40.0, "h"),
    ("40 $ / hour", 40.0, "h"),
    ("12.5$/hr", 12.5, "h"),
    ("0.02$/step", 0.02, "step"),
    ("$0.02/step", 0.02, "step"),
])
def test_parse_money(text, usd, per):
    m = parse_money(text)
    assert isinstance(m, Money)
    assert m.usd == pytest.approx(usd, rel=1e-12) and m.per == per


@pytest.mark.parametrize("text, why", [
    ("40/h", "no currency"),
    ("40", "no currency"),
    ("40€/h", "no currency"),      # only US dollars are understood
    ("40$/day", "per hour or per step"),
    ("40$", "per hour or per step"),
    ("$/h", "cannot read"),
    ("-5$/h", "cannot read"),      # a sign is not a number here
])
def test_parse_money_rejects(text, why):
    with pytest.raises(InputError) as err:
        parse_money(text, field="budget")
    msg = str(err.value)
    assert why in msg and "budget" in msg and "\n" not in msg


# ---- memory -----------------------------------------------------------------------------
@pytest.mark.parametrize("text, n_bytes", [
    ("80GiB", 80 * 2**30),
    ("80GB", 80e9),                # decimal gigabytes
    ("512MiB", 512 * 2**20),
    ("1TiB", 2**40),
    ("1.5 gib", 1.5 * 2**30),
    ("24", 24 * 2**30),            # a bare number is GiB
    (24, 24 * 2**30),
    (0.5, 2**29),
    ("1000b", 1000),
])
def test_parse_memory(text, n_bytes):
    assert parse_memory_bytes(text) == pytest.approx(n_bytes, rel=1e-12)
    assert GIB == 1073741824


@pytest.mark.parametrize("text", ["80GiBs", "80 parsecs", "lots"])
def test_parse_memory_rejects(text):
    with pytest.raises(InputError, match="memory|80GiB"):
        parse_memory_bytes(text, field="memory")


# ---- bandwidth --------------------------------------------------------------------------
@pytest.mark.parametrize("text, gb_per_s", [
    ("200Gbit/s", 25.0),           # 200 / 8
    ("100Gbps", 12.5),             # 100 / 8
    ("25GB/s", 25.0),
    ("25 gb/sec", 25.0),
    ("1.6TB/s", 1600.0),
    ("300", 300.0),                # bare number: GB/s
    (50, 50.0),
])
def test_parse_bandwidth(text, gb_per_s):
    assert parse_bandwidth_gb_per_s(text) == pytest.approx(gb_per_s, rel=1e-12)


@pytest.mark.parametrize("text", ["25GiB/h", "fast", "25 furlongs"])
def test_parse_bandwidth_rejects(text):
    with pytest.raises(InputError):
        parse_bandwidth_gb_per_s(text, field="inter_node_gb_per_s")


# ---- formatting ---------------------------------------------------------------------------
def test_format():
    assert format_duration(1.5) == "1.500 s"
    assert format_duration(0.0123) == "12.30 ms"
    assert format_duration(90e-6) == "90.0 us"
    assert format_gib(3 * 2**30) == "3.00 GiB"
