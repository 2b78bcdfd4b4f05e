"""Collectors: what turns an actor's vector-env steps into the items a data source holds.

* ``nstep.py``: n-step transitions, ``StepProcessor``;
* ``frames.py``: frames stored once (Atari), ``FrameStepProcessor``'s ``FrameRecords``, the
  pair of the frame replay (``jaxasync.replay.frames``);
* ``unrolls.py``: unrolls ``[T+1, B]`` for on-policy agents, ``UnrollCollector``;
* ``returns.py``: ``n_step_returns``, the one n-step return computation (the n-step
  collector's and the frame replay's);
* ``base.py``: ``CollectorBase``, the episode bookkeeping every collector shares.

An agent's data pipeline (``jaxasync.pipeline``) picks one; every one keeps ``Collector``.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from jaxasync.collectors.frames import FrameRecords, FrameStepProcessor
from jaxasync.collectors.nstep import StepProcessor
from jaxasync.collectors.returns import n_step_returns
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


__all__ = ["Collector", "FrameRecords", "FrameStepProcessor", "StepProcessor", "Unroll",
           "UnrollCollector", "n_step_returns"]
