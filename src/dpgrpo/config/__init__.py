"""A run's configuration: one frozen dataclass per TOML table, loaded with strict types.

``schema`` holds the sections ([model] [data] [privacy] [train] [audit]); ``loading`` the TOML
reader and writer and the typed ``section.key=value`` overrides; ``arms`` the table of training
arms; ``values`` the strict value types; ``losses`` the GRPO loss options and those refused
under prompt-level DP; ``trl`` a TRL ``GRPOConfig``'s options as overrides. Import from here:
``from dpgrpo.config import RunConfig, load_config``.
"""

from __future__ import annotations

from dpgrpo.config.loading import (
    apply_overrides,
    config_from_dict,
    embedded_default,
    load_config,
    load_protocol_config,
    read_toml,
    to_toml,
)
from dpgrpo.config.schema import (
    INIT_KEEP,
    KL_REFERENCE,
    LORA_TRAIN,
    MAX_GROUP_SIZE,
    AuditConfig,
    DataConfig,
    ModelConfig,
    PrivacyConfig,
    RunConfig,
    TrainConfig,
)

__all__ = [
    "INIT_KEEP", "KL_REFERENCE", "LORA_TRAIN", "MAX_GROUP_SIZE",
    "AuditConfig", "DataConfig", "ModelConfig", "PrivacyConfig", "RunConfig", "TrainConfig",
    "apply_overrides", "config_from_dict", "embedded_default", "load_config",
    "load_protocol_config", "read_toml", "to_toml",
]
