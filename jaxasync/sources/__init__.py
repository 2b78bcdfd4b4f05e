"""Data sources: what stands between the actors' chunks and the learner's update."""

from jaxasync.sources.base import Sample
from jaxasync.sources.queue import QueueSource
from jaxasync.sources.replay import RateLimiter, ReplaySource, UpdateCredit

__all__ = ["QueueSource", "RateLimiter", "ReplaySource", "Sample", "UpdateCredit"]
