"""Checking a release: :func:`check_release` (``dpgrpo release check RUN_OR_RELEASE``).

What it checks, each as one :class:`Check` of the :class:`ReleaseCheck` it returns:

* ``files``: every file the certificate's ``files_sha256`` names exists and has that sha256
  (the same hashing as push and resume, :func:`dpgrpo.rundir.atomic.sha256_file`);
* ``finite``: every tensor of ``adapter_model.safetensors`` is finite;
* ``epsilon``: epsilon recomputed with the project's accountant
  (:func:`dpgrpo.privacy.accounting.epsilon`) from the certificate's public figures, q (or
  m / n), sigma, the rounds charged and the accountant's delta (``delta_pld``), is not larger
  than the certified epsilon beyond :data:`EPSILON_TOLERANCE`; the ledger, when the certificate
  holds one, must charge the same rounds (a ledger whose rounds differ in q or sigma is
  accounted as it is);
* ``delta``: the certified delta covers ``delta_pld`` plus the noise-tail term recomputed at
  the certified epsilon (:func:`dpgrpo.privacy.noise.noise_tail_delta`).

This is the release's own consistency, not the mechanism's: ``dpgrpo verify`` runs the
Appendix-B checks of the code that trains. Light at import (torch and the accountant load on
call).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dpgrpo.config.json_types import JSON
from dpgrpo.errors import DPGRPOError, ReleaseError
from dpgrpo.release.files import read_certificate, release_dir_of

#: How much larger than the certified epsilon a recomputed one may be: PLD discretisation
#: (dp_accounting's value_discretization_interval 1e-4) and accountant versions move the last
#: digits; an edited certificate moves more.
EPSILON_TOLERANCE = 1e-3
#: The files a release must hold for the checks to mean anything.
REQUIRED_FILES = ("adapter_model.safetensors", "adapter_config.json", "certificate.json")


@dataclass(frozen=True)
class Check:
    """One check of a release: its name, whether it passed (None: not applicable) and why."""

    name: str
    passed: bool | None
    detail: str

    def to_dict(self) -> JSON:
        return {"name": self.name, "passed": self.passed, "detail": self.detail}


@dataclass(frozen=True)
class ReleaseCheck:
    """The outcome of :func:`check_release`: ``ok`` when no check failed."""

    release_dir: Path
    checks: list[Check] = field(default_factory=list)
    certificate: JSON = field(default_factory=dict)
    epsilon: float | None = None  # certified
    recomputed_epsilon: float | None = None
    guarantee: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.passed is not False for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.passed is False]

    def raise_for_failure(self) -> None:
        """ReleaseError naming every failed check (nothing when ``ok``)."""
        if not self.ok:
            raise ReleaseError(f"{self.release_dir} fails its release check: " + "; ".join(
                f"{c.name}: {c.detail}" for c in self.failures))

    def to_dict(self) -> JSON:
        return {"release_dir": str(self.release_dir), "ok": self.ok,
                "epsilon": self.epsilon, "recomputed_epsilon": self.recomputed_epsilon,
                "delta": self.certificate.get("delta"), "guarantee": self.guarantee,
                "checks": [c.to_dict() for c in self.checks]}


def check_release(path: str | Path, *, epsilon: bool = True, finite: bool = True) -> ReleaseCheck:
    """Check a release (a run directory or its ``release/``) against its certificate.

    ``epsilon=False`` skips the accountant (the integrity checks alone take well under a
    second). A missing or damaged certificate is a ReleaseError; every other finding is a
    failed :class:`Check` of the result (``result.ok``, ``result.raise_for_failure()``).
    """
    release = release_dir_of(path)
    if not release.is_dir():
        raise ReleaseError(f"{release} is not a directory (give a run directory or its release/)")
    if not (release / "certificate.json").is_file():
        raise ReleaseError(f"{release} is not a dpgrpo release (no certificate.json)")
    cert = read_certificate(release)
    checks = [_check_files(release, cert)]
    if finite:
        checks.append(_check_finite(release / "adapter_model.safetensors"))
    recomputed = None
    if epsilon:
        eps_check, recomputed = _check_epsilon(cert)
        checks += [eps_check, _check_delta(cert)]
    certified = _number(cert.get("epsilon"))
    return ReleaseCheck(release, checks, cert, certified, recomputed, guarantee_sentence(cert))


def _check_files(release: Path, cert: Mapping[str, object]) -> Check:
    from dpgrpo.rundir.atomic import sha256_file

    missing = [name for name in REQUIRED_FILES if not (release / name).is_file()]
    recorded = cert.get("files_sha256")
    if not isinstance(recorded, dict) or not recorded:
        return Check("files", False, "the certificate records no files_sha256: nothing to "
                                     "check the files against" + _missing(missing))
    bad = []
    for name, digest in sorted(recorded.items()):
        file = release / str(name)
        if not file.is_file():
            bad.append(f"{name} (missing)")
        elif sha256_file(file) != digest:
            bad.append(f"{name} (sha256 differs from the certificate's)")
    unhashed = sorted(set(REQUIRED_FILES) - {"certificate.json"} - set(recorded))
    if bad or missing or unhashed:
        return Check(
            "files",
            False,
            ", ".join(bad + [f"{n} (no recorded sha256)" for n in unhashed])
            + _missing([m for m in missing if m not in recorded]),
        )
    return Check("files", True, f"{len(recorded)} files match the certificate's sha256: "
                                f"{', '.join(sorted(recorded))}")


def _missing(names: list[str]) -> str:
    return f"; missing: {', '.join(names)}" if names else ""


def _check_finite(adapter: Path) -> Check:
    if not adapter.is_file():
        return Check("finite", False, f"{adapter.name} is missing")
    try:
        from safetensors.torch import load_file

        tensors = load_file(str(adapter))
    except Exception as err:  # a damaged file: safetensors' own message, on one line
        return Check("finite", False, f"{adapter.name} cannot be read "
                                      f"({' '.join(str(err).split())[:160]})")
    bad = sorted(name for name, t in tensors.items()
                 if t.is_floating_point() and not bool(t.isfinite().all()))
    if bad:
        return Check("finite", False, f"{adapter.name}: non-finite weights, {len(bad)} tensor(s) "
                                      "hold NaN or inf "
                                      f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''})")
    return Check("finite", True, f"all {len(tensors)} tensors of {adapter.name} are finite")


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _delta_pld(cert: Mapping[str, object]) -> float | None:
    """The delta the accountant was asked about: ``delta_pld``, else delta less the noise tail."""
    pld = _number(cert.get("delta_pld"))
    if pld is not None:
        return pld
    delta, tail = _number(cert.get("delta")), _number(cert.get("noise_tail_delta")) or 0.0
    return None if delta is None else delta - tail


def _public_rounds(cert: Mapping[str, object]) -> tuple[float, float, int] | str:
    """(q, sigma, rounds charged) from the certificate, or why they cannot be had."""
    q, sigma = _number(cert.get("q")), _number(cert.get("sigma"))
    n, m = _number(cert.get("n")), _number(cert.get("expected_batch"))
    if q is None and n and m is not None:
        q = m / n
    elif q is not None and n and m is not None and not math.isclose(q, m / n, rel_tol=1e-9):
        return f"q = {q} is not expected_batch / n = {m:g} / {n:g}"
    rounds = cert.get("rounds_charged")
    if q is None or sigma is None or not isinstance(rounds, int) or isinstance(rounds, bool):
        return "the certificate lacks q (or n and expected_batch), sigma or rounds_charged"
    return q, sigma, rounds


def _check_epsilon(cert: Mapping[str, object]) -> tuple[Check, float | None]:
    from dpgrpo.privacy.accounting import PrivacyLedger, RoundEvent, epsilon

    certified = _number(cert.get("epsilon"))
    if certified is None:
        return Check("epsilon", False, "the certificate's epsilon is not a number"), None
    if cert.get("private") is False or math.isinf(certified):
        return Check("epsilon", None, "not a private release (epsilon = inf): nothing to "
                                      "recompute"), None
    figures, delta = _public_rounds(cert), _delta_pld(cert)
    if isinstance(figures, str):
        return Check("epsilon", False, figures), None
    if delta is None:
        return Check("epsilon", False, "the certificate lacks delta"), None
    q, sigma, rounds = figures
    try:
        events = [RoundEvent(q, sigma, rounds)]
        ledger = cert.get("ledger")
        if isinstance(ledger, dict):
            from_ledger = PrivacyLedger.from_dict(ledger)
            if from_ledger.rounds != rounds:
                return Check("epsilon", False, f"the ledger charges {from_ledger.rounds} rounds, "
                                               f"rounds_charged says {rounds}"), None
            if any((e.sampling_rate, e.noise_multiplier) != (q, sigma)
                   for e in from_ledger.events):
                events = from_ledger.events  # rounds at other (q, sigma): account them as run
        recomputed = epsilon(events, delta)
    except (DPGRPOError, KeyError, TypeError, ValueError) as err:
        return Check("epsilon", False, f"cannot recompute epsilon ({err})"), None
    figures_text = (f"q = {q:.6g}, sigma = {sigma:.6g}, {rounds} rounds charged, "
                    f"delta = {delta:.3g}")
    if recomputed > certified + EPSILON_TOLERANCE:
        return Check("epsilon", False, f"recomputed epsilon {recomputed:.6g} ({figures_text}) "
                                       f"is larger than the certified {certified:.6g}"), recomputed
    return Check("epsilon", True, f"recomputed epsilon {recomputed:.6g} ({figures_text}) <= "
                                  f"certified {certified:.6g} (tolerance "
                                  f"{EPSILON_TOLERANCE:g})"), recomputed


def _check_delta(cert: Mapping[str, object]) -> Check:
    from dpgrpo.privacy.noise import noise_tail_delta

    delta, pld, eps = _number(cert.get("delta")), _delta_pld(cert), _number(cert.get("epsilon"))
    if cert.get("private") is False or eps is None or math.isinf(eps):
        return Check("delta", None, "not a private release")
    if delta is None or pld is None:
        return Check("delta", False, "the certificate lacks delta")
    coordinates, rounds = cert.get("trainable_coordinates"), cert.get("rounds_charged")
    tail = 0.0
    if isinstance(coordinates, int) and isinstance(rounds, int):
        try:
            tail = noise_tail_delta(coordinates, rounds, eps)
        except DPGRPOError as err:
            return Check("delta", False, f"cannot recompute the noise-tail term ({err})")
    if not 0.0 < delta < 1.0 or delta < (pld + tail) * (1 - 1e-9):
        return Check("delta", False, f"certified delta {delta:.6g} does not cover the "
                                     f"accountant's {pld:.6g} plus the noise tail {tail:.3g}")
    return Check("delta", True, f"certified delta {delta:.6g} covers the accountant's "
                                f"{pld:.6g} plus the noise tail {tail:.3g}")


def format_epsilon(value: object) -> str:
    """Epsilon for people: ``8.00``, ``0.0123``, ``inf`` (the certificate keeps the exact value)."""
    number = _number(value)
    if number is None:
        return str(value)
    if math.isinf(number):
        return "inf"
    return f"{number:.2f}" if number >= 0.1 else f"{number:.3g}"


def format_delta(value: object) -> str:
    """Delta for people: ``9.9e-05`` (two significant digits)."""
    number = _number(value)
    return str(value) if number is None else f"{number:.2g}"


def guarantee_sentence(cert: Mapping[str, object]) -> str:
    """The certificate's guarantee in one sentence."""
    eps = _number(cert.get("epsilon"))
    if cert.get("private") is False or eps is None or math.isinf(eps):
        return (f"This release has no differential-privacy guarantee (arm {cert.get('arm')}, "
                "epsilon = inf).")
    unit = cert.get("unit") or "one training prompt (problem + reference answer)"
    status = ("releasable" if cert.get("releasable") else
              "NOT releasable: " + str(cert.get("not_releasable_because", "no reason given")))
    q, sigma = _number(cert.get("q")), _number(cert.get("sigma"))
    mech = (f"Poisson-subsampled Gaussian mechanism (q = {q:.4g}, sigma = {sigma:.4g})"
            if q is not None and sigma is not None else "Poisson-subsampled Gaussian mechanism")
    return (f"The adapter is ({format_epsilon(eps)}, {format_delta(cert.get('delta'))})-DP "
            f"with respect to adding or removing {unit} among n = {cert.get('n')} public slots, "
            f"over {cert.get('rounds_charged')} rounds charged of the {mech}, accounted with "
            f"{cert.get('accountant', 'the PLD accountant')}; certificate status: {status}.")


__all__ = ["EPSILON_TOLERANCE", "Check", "ReleaseCheck", "check_release", "format_delta",
           "format_epsilon", "guarantee_sentence"]
