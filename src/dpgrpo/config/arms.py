"""The one table of training arms: what each arm is, read by every part that needs to know.

Config validation (:mod:`dpgrpo.config`), the arm builder
(:func:`dpgrpo.training.arms.make_arm`), the protocol (:mod:`dpgrpo.experiments.protocol`) and
the certificate (:func:`dpgrpo.release.certificate.certificate`) all read :data:`ARMS`; none
of them tests an arm's name. Every arm shares sampling, clipping, noise, the q*n denominator and
the accountant; only the per-record computation differs (Corollary 2).
Torch-free, so the config can import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast, get_args

from dpgrpo.errors import ConfigError

#: the arms' names, one per row of :data:`ARMS` (tests/test_arm_table.py checks they agree):
#: the type of ``train.arm`` and ``protocol.arms``
ArmName = Literal["dp-grpo", "zero-advantage", "shuffled-reward", "positive-only",
                  "non-private", "filtered-sft", "gold-sft", "non-private-gold-sft"]
#: an arm's place in the protocol (``audit``: outside it, the audit's memorising control)
Role = Literal["primary", "ladder", "reference", "audit"]
Objective = Literal["grpo", "sft"]
Rollouts = Literal["policy", "base"]


@dataclass(frozen=True)
class ArmSpec:
    """One arm: how a sampled record becomes a TrainBatch, and whether the run is private.

    ``objective``: ``"grpo"`` (Eq. 7, needs G >= 2) or ``"sft"`` (token likelihood).
    ``rollouts``: where the G completions come from: ``"policy"`` (the adapter being trained),
    ``"base"`` (the public base, adapter off) or None (no rollouts: the gold target).
    ``advantage``: the GRPO advantage mode (:data:`dpgrpo.objectives.grpo.ADVANTAGE_MODES`).
    ``private``: sigma > 0 and a certified epsilon; False is the sigma = 0 reference.
    ``role``: its place in the protocol (``primary``, ``ladder`` or ``reference``), or ``audit``:
    outside the protocol, a deliberately memorising run that the audit must detect.
    """

    name: ArmName
    objective: Objective
    rollouts: Rollouts | None
    advantage: str | None
    private: bool
    role: Role
    description: str

    @property
    def normalizes_groups(self) -> bool:
        """Whether the loss uses the G completions of one prompt together (needs G >= 2)."""
        return self.objective == "grpo"

    @property
    def base_rollouts(self) -> bool:
        """Whether rollouts come from the public base policy (the adapter switched off)."""
        return self.rollouts == "base"


def _table(*specs: ArmSpec) -> dict[ArmName, ArmSpec]:
    return {spec.name: spec for spec in specs}


#: name -> :class:`ArmSpec`, in the order the protocol and the messages list them.
ARMS: dict[ArmName, ArmSpec] = _table(
    ArmSpec("dp-grpo", "grpo", "policy", "group", True, "primary",
            "G completions from the policy, verifier rewards, Eq. (2) advantages, Eq. (7)"),
    ArmSpec("zero-advantage", "grpo", "policy", "zero", True, "primary",
            "dp-grpo with every advantage set to 0 after verification (Section V control)"),
    ArmSpec("shuffled-reward", "grpo", "policy", "shuffled", True, "ladder",
            "dp-grpo with rewards permuted within each group (Section IX ladder)"),
    ArmSpec("positive-only", "grpo", "policy", "positive", True, "ladder",
            "dp-grpo with A = r, unnormalized (Section IX ladder)"),
    ArmSpec("non-private", "grpo", "policy", "group", False, "reference",
            "dp-grpo with sigma = 0 (clipping on or off): not private"),
    ArmSpec("filtered-sft", "sft", "base", None, True, "primary",
            "DP-SFT on the base policy's verified-correct completions"),
    ArmSpec("gold-sft", "sft", None, None, True, "primary",
            "DP-SFT on each problem's reference solution"),
    ArmSpec("non-private-gold-sft", "sft", None, None, False, "audit",
            "gold-sft with sigma = 0: not private; the audit's memorising positive control"),
)


#: the protocol's focal arm (DP-GRPO: the contrasts of Table II are against it) and its
#: zero-advantage control (Section V), named once here for the reports and the study
FOCAL_ARM: ArmName = "dp-grpo"
CONTROL_ARM: ArmName = "zero-advantage"


def arm_name(name: str) -> ArmName:
    """``name`` as an arm of the table; an unknown name is a ConfigError naming ``train.arm``."""
    if name not in ARMS:
        raise ConfigError(f"train.arm must be one of {', '.join(ARMS)}; got {name!r}")
    return cast(ArmName, name)


def arm_spec(name: str) -> ArmSpec:
    """The table's row for ``name``; an unknown name is a ConfigError naming ``train.arm``."""
    return ARMS[arm_name(name)]


def private_twin(name: str) -> ArmName:
    """The private arm whose per-record computation equals the non-private arm ``name``'s
    (same objective, rollout source and advantage); ConfigError if there is none."""
    spec = arm_spec(name)
    same = (spec.objective, spec.rollouts, spec.advantage)
    twins = [a.name for a in ARMS.values()
             if a.private and (a.objective, a.rollouts, a.advantage) == same]
    if spec.private or len(twins) != 1:
        raise ConfigError(f"arm {name!r} has no private twin in the arm table")
    return twins[0]


def arms_with_role(role: Role) -> tuple[ArmName, ...]:
    """The names of the arms with protocol role ``role``, in table order."""
    return tuple(name for name, spec in ARMS.items() if spec.role == role)


ARM_NAMES: tuple[ArmName, ...] = get_args(ArmName)


__all__ = ["ARMS", "ARM_NAMES", "CONTROL_ARM", "FOCAL_ARM", "ArmName", "ArmSpec", "Objective",
           "Role", "Rollouts", "arm_name", "arm_spec", "arms_with_role", "private_twin"]
