"""A tiny env and a tiny on-policy agent for the agent-contract tests (picklable, so that
spawned actor processes can import them)."""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxasync as ja


class TinyEnv(gym.Env):
  """Observations ``[t / 8, 1]``; reward 1 for action 1; terminates once action 1 was taken 4
  times, truncates (TimeLimit) after 6 steps: both episode ends occur within a few steps."""

  observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
  action_space = gym.spaces.Discrete(2)

  def reset(self, *, seed=None, options=None):
    super().reset(seed=seed)
    self._t, self._ones = 0, 0
    return self._obs(), {}

  def _obs(self):
    return np.array([self._t / 8.0, 1.0], np.float32)

  def step(self, action):
    self._t += 1
    self._ones += int(action)
    return self._obs(), float(action), self._ones >= 4, False, {}


class TinyBoxEnv(TinyEnv):
  """``TinyEnv`` with one continuous action in the asymmetric Box ``[-1, 3]``: reward = the
  action; an action above 1 counts as ``TinyEnv``'s action 1. An action outside the Box is an
  error, so an agent that does not scale its actions to the Box fails here."""

  action_space = gym.spaces.Box(-1.0, 3.0, (1,), np.float32)

  def step(self, action):
    action = np.asarray(action)
    if action.shape != (1,) or not self.action_space.contains(action):
      raise ValueError(f"action {action!r} is not in {self.action_space}")
    self._t += 1
    self._ones += int(action[0] > 1.0)
    return self._obs(), float(action[0]), self._ones >= 4, False, {}


@dataclasses.dataclass(frozen=True)
class TinyEnvFactory:
  """``(num_envs, seed) -> SyncVectorEnv`` of ``TinyEnv`` (or ``TinyBoxEnv``: ``continuous``),
  NEXT_STEP autoreset: a ``jaxasync.VectorEnvFactory``."""

  env_id: str = "TinyEnv"
  continuous: bool = False
  frame_skip: ClassVar[int] = 1  # (VectorEnvFactory's; not a dataclass field)

  def __call__(self, num_envs: int, seed: int | None = None):
    cls = TinyBoxEnv if self.continuous else TinyEnv
    env = gym.vector.SyncVectorEnv(
        [lambda: gym.wrappers.TimeLimit(cls(), 6) for _ in range(num_envs)])
    env.reset(seed=seed)
    return env


SHAPES: list = []  # batch leaf shapes each agent's update saw (the learner's process)


class ShapeRecording:
  """Records the leaf shapes of every batch ``update`` sees (mixed in before an agent)."""

  def update(self, state, batch, weights=None):
    SHAPES.append(jax.tree.map(np.shape, batch))
    return super().update(state, batch, weights)


class ShapeRecordingDQN(ShapeRecording, ja.DQN):
  pass


class ExtrasDQN(ShapeRecordingDQN):
  """DQN whose actors also hand the learner an extra per step (the epsilon they explored
  with): transitions carry agents' extras through the replay."""

  def extras_example(self):
    return {"epsilon": np.float32(0)}

  def select(self, actions, actor_state, rng):
    eps = self.actor_metrics(actor_state)["epsilon"]
    actions, _, actor_state = super().select(actions, actor_state, rng)
    return actions, {"epsilon": np.full(actions.shape, eps, np.float32)}, actor_state


class ShapeRecordingSAC(ShapeRecording, ja.SAC):
  pass


class ShapeRecordingTD3(ShapeRecording, ja.TD3):
  pass


class ShapeRecordingIMPALA(ShapeRecording, ja.IMPALA):
  pass


class ShapeRecordingPPO(ShapeRecording, ja.PPO):
  pass


class ShapeRecordingPQN(ShapeRecording, ja.PQN):
  pass


class LinearPG(ja.Agent):
  """A linear softmax policy trained by REINFORCE-with-baseline-free one-step advantages on
  unrolls from a queue: the smallest on-policy agent, to exercise ``UnrollCollector`` and
  ``QueueSource`` end to end. Extras: the behaviour logits ``[B, A]``."""

  def __init__(self, obs_space, action_space, unroll_length: int = 5, batch_size: int = 2):
    self.obs_space, self.action_space = obs_space, action_space
    self.batch_size = batch_size
    self.data = ja.UnrollConfig(unroll_length=unroll_length)
    self.num_actions = int(action_space.n)
    self.optimizer = optax.sgd(0.1)
    self._logits = jax.jit(lambda w, obs: obs @ w)
    self._update = jax.jit(self._update_fn)

  def init(self, key):
    w = jnp.zeros((self.obs_space.shape[0], self.num_actions), jnp.float32)
    return {"w": w, "opt": self.optimizer.init(w)}

  def policy_params(self, state):
    return state["w"]

  def initial_actor_state(self, context):
    return None

  def extras_example(self):
    return {"logits": np.zeros(self.num_actions, np.float32)}

  def policy(self, params, obs, rng, explore=True):
    return np.asarray(self._logits(params, obs))

  def select(self, logits, actor_state, rng):
    gumbel = rng.gumbel(size=logits.shape)
    actions = np.argmax(logits + gumbel, axis=-1).astype(self.action_space.dtype)
    return actions, {"logits": logits.astype(np.float32)}, actor_state

  def _loss(self, w, unroll):
    logits = unroll.obs[:-1] @ w  # [T, N, A]
    logp = jax.nn.log_softmax(logits)
    a = unroll.action[:-1].astype(jnp.int32)
    logp_a = jnp.take_along_axis(logp, a[..., None], -1)[..., 0]
    mask = ~unroll.first[1:]
    return -jnp.sum(logp_a * unroll.reward[1:] * mask) / jnp.maximum(1, mask.sum())

  def _update_fn(self, state, batch):
    def step(state, unroll):
      loss, grad = jax.value_and_grad(self._loss)(state["w"], unroll)
      updates, opt = self.optimizer.update(grad, state["opt"])
      return {"w": optax.apply_updates(state["w"], updates), "opt": opt}, loss
    state, losses = jax.lax.scan(step, state, batch)
    return state, {"loss": losses.mean()}

  def update(self, state, batch, weights=None):
    SHAPES.append(jax.tree.map(np.shape, batch))
    state, metrics = self._update(state, batch)
    return state, metrics, None


def factories():
  """``{name: picklable agent factory}`` for every agent the contract test covers (the replay
  agents' data: a 2,000-transition replay, 64 env steps of warmup)."""
  obs_space, action_space = TinyEnv.observation_space, TinyEnv.action_space
  replay = ja.ReplayConfig(warmup_period=64, replay_capacity=2_000)
  return {
      "dqn": functools.partial(ShapeRecordingDQN,
                               ja.DQNConfig(hidden_sizes=(8,), batch_size=16, data=replay),
                               obs_space, action_space),
      "dqn_extras": functools.partial(ExtrasDQN,
                                      ja.DQNConfig(hidden_sizes=(8,), batch_size=16, data=replay),
                                      obs_space, action_space),
      "linear_pg": functools.partial(LinearPG, obs_space, action_space),
      "impala": functools.partial(ShapeRecordingIMPALA,
                                  ja.IMPALAConfig(hidden_sizes=(8,), batch_size=2,
                                                  data=ja.UnrollConfig(unroll_length=5)),
                                  obs_space, action_space),
      "ppo": functools.partial(ShapeRecordingPPO,
                               ja.PPOConfig(hidden_sizes=(8,), batch_size=2, num_epochs=2,
                                            num_minibatches=3,
                                            data=ja.UnrollConfig(unroll_length=5)),
                               obs_space, action_space),
      "pqn": functools.partial(ShapeRecordingPQN,
                               ja.PQNConfig(hidden_sizes=(8,), batch_size=2, num_epochs=2,
                                            num_minibatches=3,
                                            data=ja.UnrollConfig(unroll_length=5)),
                               obs_space, action_space),
      # PPO and IMPALA with a Gaussian head: TinyBoxEnv refuses an action outside its
      # asymmetric Box, so an unclipped sample fails the run.
      "ppo_box": functools.partial(ShapeRecordingPPO,
                                   ja.PPOConfig(hidden_sizes=(8,), batch_size=2, num_epochs=2,
                                                num_minibatches=3,
                                                data=ja.UnrollConfig(unroll_length=5)),
                                   obs_space, TinyBoxEnv.action_space),
      "impala_box": functools.partial(ShapeRecordingIMPALA,
                                      ja.IMPALAConfig(hidden_sizes=(8,), batch_size=2,
                                                      data=ja.UnrollConfig(unroll_length=5)),
                                      obs_space, TinyBoxEnv.action_space),
      "sac": functools.partial(ShapeRecordingSAC,
                               ja.SACConfig(hidden_sizes=(8,), batch_size=16, data=replay),
                               obs_space, TinyBoxEnv.action_space),
      "td3": functools.partial(ShapeRecordingTD3,
                               ja.TD3Config(hidden_sizes=(8,), batch_size=16, data=replay),
                               obs_space, TinyBoxEnv.action_space),
  }


def env_factory(name: str) -> TinyEnvFactory:
  """The env the agent called ``name`` in ``factories()`` acts in."""
  return TinyEnvFactory(continuous=name in ("sac", "td3", "ppo_box", "impala_box"))
