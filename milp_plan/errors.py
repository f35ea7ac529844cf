"""Errors a user can act on, and the exit codes the CLI maps them to.

* ``InputError``  -> exit 2: the input is wrong; the message names file, field and fix.
* ``Infeasible``  -> exit 1: the input is valid but no plan satisfies it.
* ``Interrupted`` -> exit 130 (SIGINT, Ctrl-C) or 143 (SIGTERM): the search was stopped;
  no output was written unless asked for.
* ``InternalError`` -> exit 3: a bug in milp-plan (e.g. the integer model disagrees with the
  cost model or the checker); the message asks for a report with the input.
* anything else   -> exit 3: an internal error (a bug); one line asking for a report.
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_NO_PLAN = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3
EXIT_SIGINT = 130
EXIT_SIGTERM = 143
EXIT_SIGPIPE = 141   # stdout's reader went away (`milp-plan ... | head`)


class MilpPlanError(Exception):
    """Base of every error milp-plan raises on purpose."""

    exit_code = EXIT_BAD_INPUT


class InputError(MilpPlanError, ValueError):
    """Bad input: one line naming the file, the field and the fix."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        self.source = source
        self.field = field
        parts = []
        if source:
            parts.append(str(source))
        if field:
            parts.append(f"field '{field}'")
        prefix = ": ".join(parts)
        text = f"{prefix}: {message}" if prefix else message
        super().__init__(" ".join(text.split()))  # one line, always


class Infeasible(MilpPlanError):
    """No plan satisfies the constraints; the message explains with numbers."""

    exit_code = EXIT_NO_PLAN


class InternalError(MilpPlanError):
    """A bug: an invariant between milp-plan's own parts broke (model vs cost model, checker)."""

    exit_code = EXIT_INTERNAL

    def __init__(self, message: str):
        super().__init__(" ".join(f"internal error, please report it with your input files and command: "
                                  f"{message}".split()))


class Interrupted(MilpPlanError):
    """The user stopped the command (SIGINT / SIGTERM); exit 128 + the signal number."""

    def __init__(self, message: str, exit_code: int = EXIT_SIGINT):
        super().__init__(message)
        self.exit_code = exit_code
