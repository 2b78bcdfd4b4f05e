"""What every collector shares: the observation to act on next and the episode returns."""

from __future__ import annotations

import numpy as np


class CollectorBase:
  """The episode bookkeeping of a collector over ``num_envs`` lockstep sub-envs.

  Subclasses set ``self._current_obs`` in ``reset`` and ``step``, add each real step's
  (unclipped) reward to ``self._ep_return`` and call ``_end_episodes`` when episodes end.

  Args:
    num_envs: sub-envs in the vector env.
  """

  def __init__(self, num_envs: int):
    self.num_envs = num_envs
    self._current_obs: np.ndarray | None = None
    self._ep_return = np.zeros(num_envs, np.float64)  # the game's score, before any clipping
    self._finished_returns: list[float] = []

  @property
  def obs(self) -> np.ndarray:
    """The observations the policy should act on next, ``[num_envs, *obs_shape]``."""
    return self._current_obs

  def pop_episode_returns(self) -> list[float]:
    """Undiscounted (unclipped) returns of the episodes completed since the last call."""
    out, self._finished_returns = self._finished_returns, []
    return out

  def _end_episodes(self, done: np.ndarray) -> None:
    """Records the returns of the sub-envs whose episode ended, ``done`` ``[num_envs]`` bool
    (at least one), and starts theirs from 0."""
    self._finished_returns.extend(self._ep_return[done].tolist())
    self._ep_return[done] = 0.0
