"""Running `milp-plan` in-process for the tests: argv in, (exit code, stdout, stderr) out."""
from __future__ import annotations

import sys

from milp_plan.cli import main


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """Works from any fixture scope (sets and restores sys.argv itself, no monkeypatch)."""
    old = sys.argv
    sys.argv = ["milp-plan", *args]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        sys.argv = old
    cap = capsys.readouterr()
    return code, cap.out, cap.err
