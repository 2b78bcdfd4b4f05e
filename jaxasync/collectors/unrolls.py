"""Fixed-length, time-major unrolls for on-policy learners (IMPALA's V-trace, PPO).

Time indexing follows dm_env / rlax: timestep ``t`` is what arrives with observation
``t`` (the reward and discount of the step that led to it, whether it starts or ends an
episode), plus the action and policy outputs chosen at it. A learner pairs consecutive
timesteps ``(t - 1 -> t)``; for V-trace over an unroll ``u`` of length ``T``::

  v_tm1 = V(u.obs[:-1])             # [T, B]
  v_t = V(u.obs[1:])                # [T, B]
  a_tm1, behaviour = u.action[:-1], u.extras[:-1]   # e.g. behaviour logits
  r_t = u.reward[1:]
  discount_t = gamma * u.discount[1:]
  mask = ~u.first[1:]               # pairs that are real transitions

A pair with ``first[t]`` goes from an episode's last observation to the next one's reset
observation: it is no transition, and the learner must zero its losses and cut the
V-trace recursion there (multiply the importance weights ``rho`` and ``c`` by ``mask``,
so ``vs - V`` is 0 at that pair and nothing of the next episode flows back).

A terminated episode has ``discount = 0`` at its last timestep: nothing is bootstrapped.
A truncated one (a time limit) keeps ``discount = 1``: its state was not terminal, so its
return continues past the cut and the learner bootstraps from ``V(obs[t])``, where
``obs[t]`` is the true final observation (gymnasium's ``NEXT_STEP`` autoreset returns it
from the done step and the reset observation only from the step after).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np

from jaxasync.collectors.base import CollectorBase


class Unroll(NamedTuple):
  """``T + 1`` timesteps of ``B`` sub-envs, every leaf time-major ``[T + 1, B, ...]``.

  Consecutive unrolls of one collector share their boundary: entry ``T`` of one is
  entry 0 of the next. Entry ``T``'s ``action`` and ``extras`` are zeros, placeholders
  (not yet chosen when the unroll is emitted) that a learner must not use; the next
  unroll's entry 0 holds the real ones.

  Attributes:
    obs: observation of timestep ``t``, ``[T + 1, B, *obs_shape]``.
    action: action taken at ``obs[t]``, ``[T + 1, B, *action_shape]``.
    extras: pytree, leaves ``[T + 1, B, ...]``: the behaviour policy's outputs at
      ``obs[t]`` (e.g. logits), passed through untouched.
    reward: reward that arrived with ``obs[t]`` (from the action at ``t - 1``),
      ``[T + 1, B]`` float32; 0 at a first timestep.
    discount: 0 if the episode terminated on arriving at ``obs[t]``, else 1,
      ``[T + 1, B]`` float32 (``gamma`` is the learner's business).
    first: ``obs[t]`` starts an episode (a reset or autoreset observation),
      ``[T + 1, B]`` bool: the pair ``(t - 1 -> t)`` is no transition.
    last: ``obs[t]`` ends an episode (terminated or truncated on arriving at it),
      ``[T + 1, B]`` bool: the action at ``t`` is the env's ignored autoreset action.
    discounted_return: with a collector's ``return_discount`` g, each sub-env's running
      discounted return of its episode so far, ``R[t] = g R[t - 1] + reward[t]`` with
      ``R = 0`` at a first timestep, ``[T + 1, B]`` float32 (the statistic gymnasium's
      ``NormalizeReward`` scales rewards by, kept where the stream of each sub-env is: a
      learner cannot continue it across unrolls); ``None`` without.
  """

  obs: np.ndarray
  action: np.ndarray
  extras: Any
  reward: np.ndarray
  discount: np.ndarray
  first: np.ndarray
  last: np.ndarray
  discounted_return: Any = None


class UnrollCollector(CollectorBase):
  """Turns the steps of a gymnasium 1.x vector env (``NEXT_STEP`` autoreset) into unrolls.

  The storage ``[T + 1, B, ...]`` is allocated once; ``step`` writes one row and every
  ``T`` steps emits a copy and moves row ``T`` to row 0 (the shared boundary).

  Episode ends, for a sub-env done (terminated or truncated) at a step:
    * that step's timestep has ``last = True``, ``obs`` = the true final observation and
      ``discount = 0`` if terminated, else 1;
    * the next step is the env's autoreset step (its action ignored): its timestep has
      ``first = True``, ``reward = 0``, ``discount = 1``, ``last = False`` and the reset
      observation, whatever the env reported.

  Args:
    num_envs: sub-envs ``B`` in the vector env.
    obs_example: one observation (no batch axis) giving shape and dtype.
    action_example: one action (no batch axis) giving shape and dtype.
    extras_example: a pytree of arrays (no batch axis), the policy outputs stored per
      step (e.g. ``{"logits": np.zeros(A, np.float32)}``); ``None`` for none.
    unroll_length: ``T >= 1``, the steps per unroll.
    return_discount: ``g`` in ``[0, 1]`` to track each sub-env's running discounted return
      (``Unroll.discounted_return``); ``None``: not tracked.
  """

  def __init__(self, num_envs: int, obs_example: np.ndarray, action_example: np.ndarray,
               extras_example: Any, unroll_length: int, return_discount: float | None = None):
    if num_envs < 1:
      raise ValueError(f"num_envs must be >= 1, got {num_envs}.")
    if unroll_length < 1:
      raise ValueError(f"unroll_length must be >= 1, got {unroll_length}.")
    if return_discount is not None and not 0.0 <= return_discount <= 1.0:
      raise ValueError(f"return_discount must be in [0, 1] or None, got {return_discount}.")
    super().__init__(num_envs)
    obs_example, action_example = np.asarray(obs_example), np.asarray(action_example)
    self.unroll_length = unroll_length
    self._obs_shape = (num_envs,) + obs_example.shape
    self._act_shape = (num_envs,) + action_example.shape
    rows = (unroll_length + 1, num_envs)
    self._obs = np.zeros(rows + obs_example.shape, obs_example.dtype)
    self._act = np.zeros(rows + action_example.shape, action_example.dtype)
    leaves, self._extras_def = jax.tree.flatten(extras_example)
    self._extras = [np.zeros(rows + np.shape(x), np.asarray(x).dtype) for x in leaves]
    self._rew = np.zeros(rows, np.float32)
    self._disc = np.ones(rows, np.float32)
    self._first = np.zeros(rows, bool)
    self._last = np.zeros(rows, bool)
    self.return_discount = return_discount
    # float64 running sum per sub-env (a float32 one would round over long episodes); its
    # rows are stored as float32, as the rewards.
    self._running_return = np.zeros(num_envs, np.float64)
    self._ret = None if return_discount is None else np.zeros(rows, np.float32)
    self._t = 0  # the row of the timestep to act on next
    self._autoreset = np.zeros(num_envs, bool)  # the next step is an autoreset step

  def __setstate__(self, state: dict) -> None:
    # A collector pickled (a lock-step run's checkpoint) before return tracking existed.
    state.setdefault("return_discount", None)
    state.setdefault("_ret", None)
    state.setdefault("_running_return", np.zeros(state["num_envs"], np.float64))
    self.__dict__.update(state)

  def reset(self, obs: np.ndarray) -> None:
    """Starts from the observations of ``env.reset()``, ``[B, *obs_shape]``.

    Any partly collected unroll is dropped; the new one starts at this timestep.
    """
    obs = self._check("obs", obs, self._obs_shape)
    self._t = 0
    self._obs[0] = obs
    self._rew[0], self._disc[0], self._first[0], self._last[0] = 0.0, 1.0, True, False
    self._current_obs = self._obs[0].copy()
    self._autoreset[:] = False
    self._ep_return[:] = 0.0
    self._running_return[:] = 0.0
    if self._ret is not None:
      self._ret[0] = 0.0

  def step(self, action: np.ndarray, reward: np.ndarray, next_obs: np.ndarray,
           terminated: np.ndarray, truncated: np.ndarray, extras: Any = None
           ) -> Unroll | None:
    """Consumes one vector-env step; returns an ``Unroll`` every ``T``-th call.

    Args:
      action: actions chosen at ``self.obs``, ``[B, *action_shape]``.
      reward, terminated, truncated: from ``env.step``, ``[B]``.
      next_obs: observations from ``env.step``, ``[B, *obs_shape]``.
      extras: the policy's outputs at ``self.obs``, a pytree shaped as
        ``extras_example`` with a leading ``[B]`` axis on every leaf.

    Returns:
      ``None``, or the ``Unroll`` (a copy) this step completes.
    """
    if self._current_obs is None:
      raise RuntimeError("UnrollCollector.step called before reset(obs).")
    action, reward, next_obs, terminated, truncated, leaves = self._checked(
        action, reward, next_obs, terminated, truncated, extras)
    # (everything checked: a bad call leaves no trace)
    self._record(action, reward, next_obs, terminated, truncated, leaves)
    self._t += 1
    if self._t < self.unroll_length:
      return None
    return self._emit()

  def _checked(self, action, reward, next_obs, terminated, truncated, extras):
    """The step's arrays with their shapes checked; ``extras`` as its leaves."""
    action = self._check("action", action, self._act_shape)
    next_obs = self._check("next_obs", next_obs, self._obs_shape)
    reward = self._check("reward", reward, (self.num_envs,))
    terminated = self._check("terminated", terminated, (self.num_envs,)).astype(bool)
    truncated = self._check("truncated", truncated, (self.num_envs,)).astype(bool)
    leaves, treedef = jax.tree.flatten(extras)
    if treedef != self._extras_def:
      raise ValueError(f"extras has structure {treedef}; extras_example had "
                       f"{self._extras_def}.")
    leaves = [self._check("an extras leaf", x, buf.shape[1:])
              for buf, x in zip(self._extras, leaves)]
    return action, reward, next_obs, terminated, truncated, leaves

  def _record(self, action, reward, next_obs, terminated, truncated, leaves) -> None:
    """Writes the action at row ``t`` and the timestep it leads to at row ``t + 1``, and
    counts the episode returns."""
    t = self._t
    self._act[t] = action
    for buf, x in zip(self._extras, leaves):
      buf[t] = x
    # An autoreset step is no transition: whatever the env reports, its timestep starts
    # an episode (gymnasium gives reward 0 and done False there; we enforce it).
    real = ~self._autoreset
    reward = np.where(real, reward, 0.0)
    terminated &= real
    done = (terminated | truncated) & real
    self._obs[t + 1] = next_obs
    self._rew[t + 1] = reward
    self._disc[t + 1] = np.where(terminated, np.float32(0.0), np.float32(1.0))
    self._first[t + 1] = self._autoreset
    self._last[t + 1] = done
    self._current_obs = np.array(next_obs, dtype=self._obs.dtype)

    if self._ret is not None:  # 0 at a first timestep (reward 0 there, and the sum restarts)
      self._running_return = np.where(self._autoreset, 0.0,
                                      self.return_discount * self._running_return + reward)
      self._ret[t + 1] = self._running_return
    self._ep_return += reward
    if done.any():
      self._end_episodes(done)
    self._autoreset = done

  def _emit(self) -> Unroll:
    """The full unroll (a copy); its last timestep becomes the next one's first."""
    # Rows 0..T-1 of action/extras are written by _record; row T never is, so it stays
    # zeros (the documented placeholder) in every copy.
    out = Unroll(obs=self._obs.copy(), action=self._act.copy(),
                 extras=jax.tree.unflatten(self._extras_def, [x.copy() for x in self._extras]),
                 reward=self._rew.copy(), discount=self._disc.copy(),
                 first=self._first.copy(), last=self._last.copy(),
                 discounted_return=None if self._ret is None else self._ret.copy())
    for buf in (self._obs, self._rew, self._disc, self._first, self._last, self._ret):
      if buf is not None:
        buf[0] = buf[-1]  # the boundary timestep starts the next unroll
    self._t = 0
    return out

  @staticmethod
  def _check(name: str, x: Any, shape: tuple[int, ...]) -> np.ndarray:
    x = np.asarray(x)
    if x.shape != shape:
      raise ValueError(f"{name} has shape {x.shape}, expected {shape} ([num_envs] + the "
                       f"example's shape).")
    return x
