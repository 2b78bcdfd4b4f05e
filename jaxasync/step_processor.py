"""Turns the steps of a gymnasium vector env into n-step transitions.

The one step processor of the project: the synchronous ``Trainer`` and every
``Actor`` use it.
"""

from __future__ import annotations

import numpy as np

from jaxasync.types import Transition


class StepProcessor:
  """n-step transitions from a gymnasium 1.x vector env in ``NEXT_STEP`` autoreset mode.

  Every sub-env ``e`` keeps the last ``n`` (obs, action, reward) of its current
  episode in a ring shared by all sub-envs (they step in lockstep), so one call
  costs a handful of numpy operations whatever ``num_envs`` is.

  Episode ends:
    * terminated at step ``t``: every pending transition is emitted with
      ``discount = 0`` (no bootstrap).
    * truncated at step ``t``: every pending transition is emitted with
      ``discount = gamma^m`` and ``next_obs`` = the observation the env returned
      at ``t``, which in ``NEXT_STEP`` mode is the true final observation.
    * the step after a done step is gymnasium's autoreset step: the action is
      ignored, the returned observation is the reset one, and no transition is
      made from it.
  No transition straddles two episodes.

  Args:
    num_envs: sub-envs in the vector env.
    obs_example: one observation (no batch axis) giving shape and dtype.
    action_example: one action (no batch axis) giving shape and dtype.
    n_step: ``n >= 1``.
    gamma: discount in ``[0, 1]``.
  """

  def __init__(self, num_envs: int, obs_example: np.ndarray, action_example: np.ndarray,
               n_step: int = 1, gamma: float = 0.99):
    if n_step < 1:
      raise ValueError(f"n_step must be >= 1, got {n_step}.")
    if not 0.0 <= gamma <= 1.0:
      raise ValueError(f"gamma must be in [0, 1], got {gamma}.")
    obs_example = np.asarray(obs_example)
    action_example = np.asarray(action_example)
    self.num_envs, self.n, self.gamma = num_envs, n_step, gamma
    self._obs = np.zeros((n_step, num_envs) + obs_example.shape, obs_example.dtype)
    self._act = np.zeros((n_step, num_envs) + action_example.shape, action_example.dtype)
    self._rew = np.zeros((n_step, num_envs), np.float64)
    self._len = np.zeros(num_envs, np.int64)  # pending steps of each sub-env
    self._t = 0  # ring position of the next step
    self._current_obs: np.ndarray | None = None
    self._autoreset = np.zeros(num_envs, bool)  # next step is an autoreset step
    self._powers = gamma ** np.arange(n_step + 1, dtype=np.float64)
    self._ep_return = np.zeros(num_envs, np.float64)
    self._finished_returns: list[float] = []

  def reset(self, obs: np.ndarray) -> None:
    """Starts from the observations of ``env.reset()``, ``[num_envs, *obs_shape]``."""
    self._current_obs = np.array(obs, copy=True)
    self._len[:] = 0
    self._autoreset[:] = False
    self._ep_return[:] = 0.0

  def pop_episode_returns(self) -> list[float]:
    """Undiscounted returns of the episodes completed since the last call."""
    out, self._finished_returns = self._finished_returns, []
    return out

  @property
  def obs(self) -> np.ndarray:
    """The observations the policy should act on next, ``[num_envs, *obs_shape]``."""
    return self._current_obs

  def step(self, action: np.ndarray, reward: np.ndarray, next_obs: np.ndarray,
           terminated: np.ndarray, truncated: np.ndarray) -> Transition:
    """Consumes one vector-env step; returns the transitions it completes.

    Args:
      action: actions taken at ``self.obs``, ``[num_envs, *action_shape]``.
      reward, terminated, truncated: from ``env.step``, ``[num_envs]``.
      next_obs: observations from ``env.step``, ``[num_envs, *obs_shape]``.

    Returns:
      A ``Transition`` batch ``[m, ...]`` (``m`` may be 0), ordered by sub-env
      then by start time.
    """
    if self._current_obs is None:
      raise RuntimeError("StepProcessor.step called before reset(obs).")
    n, slot = self.n, self._t % self.n
    real = ~self._autoreset  # sub-envs whose step is a real transition
    self._obs[slot] = self._current_obs
    self._act[slot] = action
    self._rew[slot] = reward
    self._len += real
    done = real & (np.asarray(terminated) | np.asarray(truncated))
    terminated = real & np.asarray(terminated)
    self._ep_return += np.where(real, reward, 0.0)
    if done.any():
      self._finished_returns.extend(self._ep_return[done].tolist())
      self._ep_return[done] = 0.0

    # ret[k, e]: discounted return of the pending entry that started k steps ago.
    ret = np.empty((n, self.num_envs), np.float64)
    acc = np.zeros(self.num_envs, np.float64)
    for k in range(n):
      acc = self._rew[(self._t - k) % n] + self.gamma * acc
      ret[k] = acc
    k_idx = np.arange(n)[:, None]
    pending = k_idx < self._len[None, :]
    emit = pending & (done[None, :] | (k_idx == n - 1))
    # Order by sub-env, then oldest entry (largest k) first.
    es, ks = np.nonzero(emit.T[:, ::-1])
    ks = n - 1 - ks
    slots = (self._t - ks) % n
    discount = np.where(terminated[es], 0.0, self._powers[ks + 1])
    out = Transition(
        obs=self._obs[slots, es],
        action=self._act[slots, es],
        reward=ret[ks, es].astype(np.float32),
        discount=discount.astype(np.float32),
        next_obs=np.asarray(next_obs)[es],
    )
    # Bookkeeping: a full window drops its oldest entry; an episode end clears all.
    self._len = np.where(done, 0, np.minimum(self._len, n - 1))
    self._autoreset = done
    self._current_obs = np.array(next_obs, copy=True)
    self._t += 1
    return out
