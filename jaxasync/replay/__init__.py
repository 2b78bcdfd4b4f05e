"""Replay buffers: numpy storage owned by the learner."""

from jaxasync.replay.prioritized import PrioritizedReplayBuffer, linear_beta
from jaxasync.replay.sum_tree import SumTree
from jaxasync.replay.uniform import ReplayBuffer

__all__ = ["ReplayBuffer", "PrioritizedReplayBuffer", "SumTree", "linear_beta"]
