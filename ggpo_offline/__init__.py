"""ggpo-offline: fixed-pool experiments for RL with verifiable rewards."""

__version__ = "0.1.0"
