"""nanorl: small, readable, fast reinforcement learning for language models."""

from nanorl.config import DPOConfig, GRPOConfig, PPOConfig, RMConfig, SFTConfig, preset
from nanorl.grpo import train
from nanorl.tasks import Example, Task

__version__ = "0.1.0"
__all__ = ["GRPOConfig", "PPOConfig", "DPOConfig", "SFTConfig", "RMConfig", "preset", "train", "Task", "Example"]
