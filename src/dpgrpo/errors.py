"""Exceptions. Library code raises these; the CLI turns them into one-line messages.

Privacy rules broken at run time raise a subclass of :class:`PrivacyError` that says which
rule and why it matters, never a bare ``assert`` (which ``python -O`` would strip).
"""

from __future__ import annotations


class DPGRPOError(Exception):
    """Base class of every error dpgrpo raises on purpose."""


class ConfigError(DPGRPOError, ValueError):
    """A configuration or command-line value is missing, unknown or inconsistent."""


class DataError(DPGRPOError, ValueError):
    """Bad input data. The message names the file, the line (or row) and the field."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        where = []
        if path is not None:
            where.append(str(path))
        if line is not None:
            where.append(f"line {line}")
        if field is not None:
            where.append(f"field '{field}'")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)
        self.path, self.line, self.field = path, line, field


class EmptyDataError(DataError):
    """A data file (or hub split) that exists but holds no records."""


class PrivacyError(DPGRPOError):
    """A privacy invariant would be broken; the message says which one and why."""


class PrivacyBudgetError(PrivacyError, ValueError):
    """The requested (epsilon, delta) cannot be met, or accounting parameters are invalid."""


class PublicDataError(PrivacyError):
    """Data declared public (a warm start's training set, a tuning proxy) shares questions with
    the private training set, compared by content (:mod:`dpgrpo.privacy.public_data`): it would
    be used outside the mechanism, where no certificate covers it."""


class ReleaseError(PrivacyError):
    """Something private (generator states, telemetry) would be written into a release."""


class LedgerError(PrivacyError):
    """The privacy records of a run contradict each other or the run's (q, sigma); resuming
    could certify a smaller epsilon than was spent, so the run stops instead."""


class RecoveryError(DPGRPOError):
    """A recovery file (checkpoint, journal, saved config) is damaged beyond what resume can
    repair without risking the ledger; the message names the file."""


class UserCodeError(DPGRPOError):
    """Code the user supplied (a custom task module, its factory, a reward function) raised.

    The message names the module or function and, during training, the round; the user's
    traceback is not the library's failure, so the CLI shows it as one line like any error.
    """


class RunLockedError(DPGRPOError):
    """Another process is writing to the run directory (one writer per run)."""


class DiskFullError(DPGRPOError, OSError):
    """A write failed because the disk (or quota) is full; the message says where."""


class ReadOnlyError(DPGRPOError, OSError):
    """A write failed because the directory or filesystem is read-only; the message says where."""


class MechanismAuditError(PrivacyError):
    """The white-box audit measured the mechanism off its certificate (noise, clipping or the
    denominator is not what the accountant assumed), so the certified epsilon is not valid."""
