"""Typed configuration: frozen dataclasses are the single source of truth for every key.

    from hybridflow.config import load_config
    cfg = load_config(["my.yaml"], ["algorithm.adv_estimator=rloo", "actor_rollout_ref.rollout.n=8"])
    cfg.actor_rollout_ref.actor.clip_ratio_low   # a float, resolved at load

See docs/configuration.md for the override syntax and every key.
"""

from hybridflow.config.actor_rollout_ref import (
    ActorConfig,
    ActorRolloutRefConfig,
    ModelConfig,
    MultiTurnConfig,
    OptimConfig,
    PolicyLossConfig,
    RefConfig,
    RolloutConfig,
    RolloutCorrectionConfig,
    ValKwargsConfig,
)
from hybridflow.config.build import to_dict
from hybridflow.config.errors import ConfigError
from hybridflow.config.loader import load_config, load_structured
from hybridflow.config.params import advantage_params, policy_loss_params, scalar_params
from hybridflow.config.ppo import (
    AlgorithmConfig,
    CriticConfig,
    CriticModelConfig,
    CustomRewardFunctionConfig,
    DataConfig,
    FilterGroupsConfig,
    KLControlConfig,
    OverlongBufferConfig,
    PFPPOConfig,
    PPOConfig,
    RewardModelConfig,
    TrainerConfig,
)
from hybridflow.config.ppo_rules import finalize_ppo_config
from hybridflow.config.sft import (
    SFTConfig,
    SFTDataConfig,
    SFTModelConfig,
    SFTMultiTurnConfig,
    SFTOptimConfig,
    SFTTrainerConfig,
)
from hybridflow.config.sft_rules import finalize_sft_config, load_sft_config
from hybridflow.config.verl_keys import classify_verl_key, explain_verl_key

__all__ = [
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AlgorithmConfig",
    "ConfigError",
    "CriticConfig",
    "CriticModelConfig",
    "CustomRewardFunctionConfig",
    "DataConfig",
    "FilterGroupsConfig",
    "KLControlConfig",
    "ModelConfig",
    "MultiTurnConfig",
    "OptimConfig",
    "OverlongBufferConfig",
    "PFPPOConfig",
    "PPOConfig",
    "PolicyLossConfig",
    "RefConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "RolloutCorrectionConfig",
    "SFTConfig",
    "SFTDataConfig",
    "SFTModelConfig",
    "SFTMultiTurnConfig",
    "SFTOptimConfig",
    "SFTTrainerConfig",
    "TrainerConfig",
    "ValKwargsConfig",
    "advantage_params",
    "classify_verl_key",
    "explain_verl_key",
    "finalize_ppo_config",
    "finalize_sft_config",
    "load_config",
    "load_sft_config",
    "load_structured",
    "policy_loss_params",
    "scalar_params",
    "to_dict",
]
