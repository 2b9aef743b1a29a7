"""hybridflow: RL post-training of language models in the HybridFlow single-controller design."""

__version__ = "0.1.0"
