"""Reading a native profile without pandas (profile._plain_rows) gives what pandas' reading
gives: the same points, the same table, the same error where the file is bad.

The reference is the pandas path (profile._read_frame: pd.read_csv + validate_table), which
read_native takes itself for a table that is not plain."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from milp_plan import profile as P
from milp_plan.errors import InputError
from tiny_instance import profile_csv

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "profiles").glob("*.csv"))
FAST = settings(max_examples=60, deadline=None)


def by_pandas(path: Path) -> P.Profile:
    """The reference: the table as pandas reads and validates it."""
    text = path.read_text(encoding="utf-8")
    body = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))
    header = [line for line in text.splitlines() if line.startswith("#")]
    tp_comm = any(line.replace(" ", "") == "#tp_comm_included:true" for line in header)
    return P.Profile(P._read_frame(body, str(path), tp_comm))


def same_points(a: P.Profile, b: P.Profile) -> None:
    assert a._points == b._points          # LayerCost equality: every float bit for bit
    assert {k: type(v) for k, v in a._points.items()} == {k: type(v) for k, v in b._points.items()}
    assert [type(x) for k in a._points for x in k] == [type(x) for k in b._points for x in k]
    assert a._index == b._index
    assert a._optimizer_ns == b._optimizer_ns


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_profiles_read_plain_and_equal_pandas(path):
    text = path.read_text(encoding="utf-8")
    body = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))
    assert P._plain_rows(body) is not None, "a shipped profile should not need pandas"
    got, want = P.read_native(path), by_pandas(path)
    same_points(got, want)
    pd.testing.assert_frame_equal(got.table, want.table)
    assert got.gpus() == want.gpus() and got.models() == want.models()


def test_tiny_profile_and_its_operations_equal_pandas(tmp_path):
    """merged / renamed_gpus / for_model / only on rows equal the same pandas operations."""
    p = tmp_path / "t.csv"
    p.write_text(profile_csv(), encoding="utf-8")
    other = tmp_path / "o.csv"
    # a second table: one point already in the first (the first's row is kept), one new, a new column
    lines = [line for line in profile_csv().splitlines() if not line.startswith("#")]
    cols = lines[0].split(",")
    first = lines[1].split(",")
    new = list(first)
    new[cols.index("seq_length")] = "1000"
    changed = list(first)
    changed[cols.index("fwd_ms")] = "99"
    other.write_text("\n".join([",".join(cols + ["param_bytes"]), ",".join(changed + ["7"]),
                                ",".join(new + ["8"])]) + "\n", encoding="utf-8")
    a, b = P.read_native(p), P.read_native(other)
    fa, fb = by_pandas(p), by_pandas(other)
    for got, want in [(a.merged(b), fa.merged(fb)), (a.renamed_gpus({"G": "H"}), fa.renamed_gpus({"G": "H"})),
                      (a.for_model("m"), fa.for_model("m")), (a.only(gpus=["S"]), fa.only(gpus=["S"])),
                      (a.only(model="tiny"), fa.only(model="tiny")), (a.only(model="none"), fa.only(model="none"))]:
        same_points(got, want)
        pd.testing.assert_frame_equal(got.table, want.table)
        pd.testing.assert_frame_equal(P.Profile(got.table).table, got.table)
    merged = a.merged(b)
    key = tuple(first[cols.index(c)] for c in P.KEY)
    key = (key[0], key[1], int(key[2]), int(key[3]), int(key[4]), key[5])
    assert merged.exact(*key).fwd_ms == float(first[cols.index("fwd_ms")])   # the first table's row wins
    assert len(merged.rows) == len(a.rows) + 1


# decimal cells: those _plain_number takes read to pandas' double exactly
@FAST
@given(st.integers(0, 10**15 - 1), st.integers(0, 20), st.sampled_from(["", "e", "E"]), st.integers(-5, 5))
def test_plain_numbers_equal_pandas(mantissa, frac_digits, e, exp):
    digits = str(mantissa).rjust(frac_digits + 1, "0")
    cell = digits[:len(digits) - frac_digits] + ("." + digits[-frac_digits:] if frac_digits else "")
    if e:
        cell += f"{e}{exp}"
    got = P._plain_number(cell)
    want = float(pd.read_csv(__import__("io").StringIO(f"x\n{cell}\n"), dtype={"x": float}).x[0])
    if got is not None:
        assert got == want, cell


CELLS = ["0", "1", "2.5", "1e-10", "1e9", "1000000001", "-1", "+1", "inf", "nan", "NA", "", " 1", "x", "1.0",
         "0.0000000001", "12345678901234567", "²", "\"2\"", "1,5", "True", "block", "head", "A", "4090", "1e400"]


@pytest.mark.parametrize("blank_line", [False, True])
def test_odd_cells_read_as_pandas_reads_them(tmp_path, blank_line):
    """Each odd cell in each column (then one each with a blank line in the table)."""
    columns = P.KEY + ["fwd_ms", "bwd_ms", "attn_core_fwd_ms"]
    cases = [(c, v, i) for i, (c, v) in enumerate((c, v) for c in columns for v in CELLS)]
    for column, cell, row in (cases[::7] if blank_line else cases):
        read_one_changed(tmp_path / f"{row}.csv", column, cell, row, blank_line)


def read_one_changed(p, column, cell, row, blank_line):
    """One cell changed: read_native gives pandas' points, or the same error as pandas."""
    lines = profile_csv().splitlines()
    head = [line for line in lines if line.startswith("#")]
    table = [line for line in lines if not line.startswith("#")]
    cols = table[0].split(",")
    r = 1 + row % (len(table) - 1)
    cells = table[r].split(",")
    cells[cols.index(column)] = cell
    table[r] = ",".join(cells)
    if blank_line:
        table.insert(2, "")
    p.write_text("\n".join(head + table) + "\n", encoding="utf-8")
    try:
        want = by_pandas(p)
    except (InputError, ValueError, TypeError) as exc:
        with pytest.raises(type(exc)) as got:
            P.read_native(p)
        assert str(got.value) == str(exc), (column, cell)
        return
    got = P.read_native(p)
    same_points(got, want)
    pd.testing.assert_frame_equal(got.table, want.table)


def test_default_solve_imports_no_pandas():
    """The shipped default instance and a CP-SAT solve of its tiny work budget load no pandas;
    a later `import pandas` gets pandas (backends.import_cp_model's stand-in is gone)."""
    code = (
        "import sys\n"
        "from milp_plan.instance import build_instance\n"
        "from milp_plan.job import Objective\n"
        "from milp_plan import solve\n"
        "inst = build_instance()\n"
        "from milp_plan.solvers.backends import import_cp_model\n"
        "cp = import_cp_model()\n"
        "m = cp.CpModel(); x = m.new_int_var(0, 3, 'x'); m.maximize(x)\n"
        "s = cp.CpSolver(); assert s.solve(m) == cp.OPTIMAL and s.value(x) == 3\n"
        "assert 'pandas' not in sys.modules, sorted(k for k in sys.modules if 'pandas' in k)\n"
        "import pandas\n"
        "assert hasattr(pandas, 'DataFrame') and len(inst.profile.table) == len(inst.profile.rows)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
