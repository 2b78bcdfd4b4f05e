"""Greedy (or low-epsilon) evaluation on an env of its own."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxasync.envs import EnvFactory

PyTree = Any


def to_cpu(params: PyTree) -> PyTree:
  """Commits a host copy of ``params`` to the CPU device, so jitted acting runs there."""
  cpu = jax.devices("cpu")[0]
  return jax.device_put(jax.tree.map(np.array, params), cpu)


class Evaluator:
  """Runs ``num_episodes`` episodes, one per sub-env of a vector env, and averages their returns.

  Args:
    agent: has ``act(params, obs, epsilon, rng, explore=False)`` (``explore=False``: noisy
      nets use their mean weights).
    env_factory: builds the evaluation env (may differ from the training env).
    num_episodes: episodes per evaluation (run in parallel, one per sub-env).
    epsilon: exploration during evaluation (0 = greedy).
    seed: evaluation ``k`` resets its env with ``seed + k``.
  """

  def __init__(self, agent, env_factory: EnvFactory, num_episodes: int = 10,
               epsilon: float = 0.0, seed: int = 10_000):
    self.agent, self.num_episodes, self.epsilon = agent, num_episodes, epsilon
    self._env = env_factory(num_episodes, seed=seed)
    obs, act = self._env.single_observation_space, self._env.single_action_space
    want_obs, want_act = getattr(agent, "obs_space", None), getattr(agent, "action_space", None)
    if want_obs is not None and (obs.shape != want_obs.shape or obs.dtype != want_obs.dtype
                                 or act != want_act):
      self._env.close()
      from jaxasync.envs import ConfigError
      raise ConfigError(
          f"the evaluation env ({getattr(env_factory, 'env_id', env_factory)}) has observations "
          f"{obs.shape} {obs.dtype} and actions {act}, the training env {want_obs.shape} "
          f"{want_obs.dtype} and {want_act}: the agent cannot act in it. Pass an --eval-env-id "
          "with the same spaces as --env-id.")
    self._seed, self._count = seed, 0
    self._rng = np.random.default_rng(seed)
    self.steps = 0  # vector steps taken in all evaluations (progress, for the watchdog)

  def evaluate(self, params: PyTree) -> float:
    """Mean undiscounted return over ``num_episodes`` first episodes."""
    params = to_cpu(params)
    obs, _ = self._env.reset(seed=self._seed + self._count)
    self._count += 1
    n = self.num_episodes
    returns = np.zeros(n)
    running = np.ones(n, bool)
    while running.any():
      actions = self.agent.act(params, obs, self.epsilon, self._rng, explore=False)
      obs, reward, terminated, truncated, _ = self._env.step(actions)
      self.steps += 1
      returns += reward * running
      running &= ~(terminated | truncated)
    return float(returns.mean())

  def close(self) -> None:
    self._env.close()
