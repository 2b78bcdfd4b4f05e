"""Collectors: what turns an actor's vector-env steps into the items a data source holds.

* n-step transitions: ``jaxasync.step_processor.StepProcessor``;
* frames stored once (Atari): ``jaxasync.replay.frames.FrameStepProcessor``, the pair of the
  frame replay;
* unrolls ``[T+1, B]`` for on-policy agents: ``UnrollCollector``.

An agent's data pipeline (``jaxasync.pipeline``) picks one; every one keeps ``Collector``.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from jaxasync.collectors.unrolls import Unroll, UnrollCollector


class Collector(Protocol):
  """The actor's side of the data: fed every vector step, it returns the items that step
  completes.

  Built by a factory ``(num_envs, obs_example, action_example) -> Collector`` (the data
  pipeline's ``collector_factory``, picklable for process actors).
  """

  @property
  def obs(self) -> np.ndarray:
    """The observations to act on next, ``[num_envs, *obs_shape]``."""

  def reset(self, obs: np.ndarray) -> None:
    """Starts from the observations of ``env.reset()``."""

  def step(self, action: np.ndarray, reward: np.ndarray, next_obs: np.ndarray,
           terminated: np.ndarray, truncated: np.ndarray, extras: Any = None) -> Any:
    """One vector step (gymnasium's ``NEXT_STEP`` autoreset: the step after an episode's end
    is an autoreset step and completes nothing); the items it completes, or ``None``."""

  def pop_episode_returns(self) -> list[float]:
    """Undiscounted returns of the episodes completed since the last call."""


__all__ = ["Collector", "Unroll", "UnrollCollector"]
