"""Evaluation of the agent's evaluation policy on an env of its own."""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxasync.agent import ActorContext, Agent
from jaxasync.envs import VectorEnvFactory
from jaxasync.param_store import to_cpu

PyTree = Any


class Evaluator:
  """Runs ``num_episodes`` episodes, one per sub-env of a vector env, and averages their returns.

  Args:
    agent: acts with ``act(..., explore=False)`` from its evaluation actor state
      (``ActorContext(evaluation=True)``): the agent decides what its evaluation policy is.
    env_factory: builds the evaluation env (may differ from the training env).
    num_episodes: episodes per evaluation (run in parallel, one per sub-env).
    seed: evaluation ``k`` resets its env with ``seed + k``.
  """

  def __init__(self, agent: Agent, env_factory: VectorEnvFactory, num_episodes: int = 10,
               seed: int = 10_000):
    self.agent, self.num_episodes = agent, num_episodes
    self._env = env_factory(num_episodes, seed=seed)
    obs, act = self._env.single_observation_space, self._env.single_action_space
    want_obs, want_act = getattr(agent, "obs_space", None), getattr(agent, "action_space", None)
    if want_obs is not None and (obs.shape != want_obs.shape or obs.dtype != want_obs.dtype
                                 or act != want_act):
      self._env.close()
      from jaxasync.errors import ConfigError
      raise ConfigError(
          f"the evaluation env ({env_factory.env_id}) has observations "
          f"{obs.shape} {obs.dtype} and actions {act}, the training env {want_obs.shape} "
          f"{want_obs.dtype} and {want_act}: the agent cannot act in it. Evaluate on an env "
          "(eval_env_id) with the same spaces as the training env (env_id).")
    self._seed, self.count = seed, 0  # evaluation k resets with seed + k
    self._rng = np.random.default_rng(seed)
    self.steps = 0  # vector steps taken in all evaluations (progress, for the watchdog)

  def evaluate(self, params: PyTree) -> float:
    """Mean undiscounted return over ``num_episodes`` first episodes."""
    return float(self.episode_returns(params).mean())

  def episode_returns(self, params: PyTree) -> np.ndarray:
    """The undiscounted returns ``[num_episodes]`` of one evaluation's first episodes."""
    params = to_cpu(params)
    obs, _ = self._env.reset(seed=self._seed + self.count)
    self.count += 1
    n = self.num_episodes
    returns = np.zeros(n)
    running = np.ones(n, bool)
    actor_state = self.agent.initial_actor_state(ActorContext(num_envs=n, evaluation=True))
    while running.any():
      actions, _, actor_state = self.agent.act(params, obs, actor_state, self._rng, explore=False)
      obs, reward, terminated, truncated, _ = self._env.step(actions)
      self.steps += 1
      returns += reward * running
      running &= ~(terminated | truncated)
    return returns

  def close(self) -> None:
    self._env.close()
