"""PQN (Gallici et al., ICLR 2025): Q(lambda) on unrolls, no replay and no target network.

Actors act epsilon-greedily on a Q-network and push unrolls (``jaxasync.collectors.unrolls``);
the learner turns each batch of unrolls into Peng's Q(lambda) returns from its own current
network, held constant for the iteration, then regresses ``Q(s, a)`` on them for
``num_epochs`` passes of ``num_minibatches`` shuffled minibatches (as PPO iterates). What
keeps bootstrapping from the online network stable without a target network is normalised
features: LayerNorm before every nonlinearity of the torso (the paper's analysis; on by
default here, ``layer_norm``), and data from many envs at once rather than a replay.

Targets, for the ``T`` pairs ``(t -> t + 1)`` of an unroll (``rlax.lambda_returns``)::

  G_t = r_t + d_t ((1 - lambda_t) max_a Q(s_{t+1}, a) + lambda_t G_{t+1}),
  G_{T-1} = r_{T-1} + d_{T-1} max_a Q(s_T, a),

``d_t = gamma`` times the env's discount (0 where the episode terminated, and where it was
truncated with ``truncation_as_termination``). Episode boundaries inside an unroll: the pair
from an episode's last observation to the next one's reset observation is no transition
(masked out of the loss), and ``lambda_t`` is 0 into it, so the last real pair bootstraps
from ``max_a Q`` of the true final observation when the episode was truncated and from
nothing when it terminated; nothing of the next episode flows back. Actors that run ahead
(async) make the data slightly off-policy; Q(lambda) with Peng's targets ignores that, as
the paper's does, and the queue drops unrolls older than ``max_policy_lag`` iterations.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal, NamedTuple, Sequence

import chex
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import rlax
import tyro

from jaxasync.agent import Agent, key_data
from jaxasync.agents.actor_critic import batch_major, masked_mean
from jaxasync.agents.dqn import greedy_q_metrics
from jaxasync.agents.exploration import EpsilonGreedyActing
from jaxasync.agents.learner_state import LearnerState
from jaxasync.agents.minibatches import minibatch_epochs
from jaxasync.agents.optimizers import adam_with_clipping
from jaxasync.agents.q_network import QNetwork
from jaxasync.collectors.unrolls import Unroll
from jaxasync.envs import check_box_observations
from jaxasync.errors import ConfigError
from jaxasync.networks import Torso, check_torso, check_torso_fields, default_torso
from jaxasync.pipeline import UnrollConfig

PyTree = Any


@dataclasses.dataclass(frozen=True)
class PQNConfig:
  """Hyperparameters of the PQN learner and its epsilon-greedy actors (defaults: those of
  CleanRL's pqn.py for classic control, on Adam).

  Attributes:
    torso: network body; 'auto' picks by observation (MLP for vectors, MinAtar CNN for
      small grids, Nature CNN for Atari frame stacks).
    hidden_sizes: MLP layer widths (a CNN's dense width is the last one).
    layer_norm: LayerNorm before each ReLU of the torso: what lets PQN bootstrap from its
      online network without a target network.
    batch_size: unrolls per iteration, their sub-envs side by side.
    gamma: discount per env step.
    truncation_as_termination: end the return at an episode cut by a time limit, as at a
      termination (what CleanRL's pqn.py does), instead of bootstrapping from its final
      observation. Wrong for a Markov state (the time left is not in it), but on CartPole,
      where every episode of a good policy is cut at 500 steps, bootstrapping lets every
      action's value reach the same bound, 1 / (1 - gamma), the action gap vanish and
      the greedy policy drift off; ending the return at the cut keeps them below it.
    q_lambda: lambda of the Q(lambda) returns (0: one-step Q-learning targets; 1: Monte
      Carlo returns to the unroll's end).
    learning_rate: Adam step size (the initial one when annealed).
    learning_rate_decay_steps: iterations over which the step size anneals linearly to 0;
      0: constant.
    adam_eps: Adam epsilon.
    max_grad_norm: global-norm gradient clipping per minibatch step; 0: none.
    huber_delta: the loss is Huber's with this threshold on the TD error, linear beyond it,
      so that no single target far off (a return ended at a time limit) pulls harder than
      the threshold; 0: the squared error (the paper's). Unlike DQN's field of that name,
      which is always on, 0 here turns it off.
    num_epochs: passes over each batch of unrolls.
    num_minibatches: minibatches per pass; the batch's T x N transitions must divide by it.
    eps_start: epsilon-greedy exploration at env step 0.
    eps_end: epsilon-greedy exploration after eps_decay_steps.
    eps_decay_steps: env steps (all envs together) over which epsilon falls linearly.
    eval_epsilon: epsilon-greedy exploration during evaluation (0: greedy).
    data: unrolls of ``unroll_length`` steps through a queue that drops those older than
      ``max_policy_lag`` iterations (``UnrollConfig``; flags ``--agent.unroll-length`` ...).
  """

  torso: Literal["auto", Torso] = "auto"
  hidden_sizes: Sequence[int] = (128, 128)
  layer_norm: bool = True
  batch_size: int = 1
  gamma: float = 0.99
  truncation_as_termination: bool = False
  q_lambda: float = 0.65
  learning_rate: float = 2.5e-4
  learning_rate_decay_steps: int = 0
  adam_eps: float = 1e-8
  max_grad_norm: float = 10.0
  huber_delta: float = 0.0
  num_epochs: int = 4
  num_minibatches: int = 4
  eps_start: float = 1.0
  eps_end: float = 0.05
  eps_decay_steps: int = 250_000
  eval_epsilon: float = 0.0
  data: Annotated[UnrollConfig, tyro.conf.arg(name="")] = dataclasses.field(
      default_factory=lambda: UnrollConfig(unroll_length=64, max_policy_lag=4))

  def validate(self) -> None:
    check_torso_fields(self.torso, self.hidden_sizes, "(128, 128)")
    if self.batch_size < 1:
      raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}.")
    self.data.validate(self.batch_size)
    if not 0.0 <= self.gamma <= 1.0:
      raise ConfigError(f"gamma must be in [0, 1], got {self.gamma}.")
    if not 0.0 <= self.q_lambda <= 1.0:
      raise ConfigError(f"q_lambda must be in [0, 1], got {self.q_lambda}.")
    if not 0.0 < self.learning_rate < float("inf"):  # (also refuses NaN)
      raise ConfigError(f"learning_rate must be a finite number > 0, got {self.learning_rate}.")
    if self.learning_rate_decay_steps < 0:
      raise ConfigError(f"learning_rate_decay_steps must be >= 0 (0: constant), got "
                        f"{self.learning_rate_decay_steps}.")
    if not 0.0 <= self.huber_delta < float("inf"):  # (also refuses NaN)
      raise ConfigError(f"huber_delta must be a finite number >= 0 (0: squared error), got "
                        f"{self.huber_delta}.")
    if not self.max_grad_norm >= 0.0:
      raise ConfigError(f"max_grad_norm must be >= 0 (0: no clipping), got {self.max_grad_norm}.")
    if self.num_epochs < 1 or self.num_minibatches < 1:
      raise ConfigError(f"num_epochs and num_minibatches must be >= 1, got {self.num_epochs} "
                        f"and {self.num_minibatches}.")
    if not (0.0 <= self.eps_end <= 1.0 and 0.0 <= self.eps_start <= 1.0
            and 0.0 <= self.eval_epsilon <= 1.0):
      raise ConfigError("eps_start and eps_end must be in [0, 1], and so must eval_epsilon.")
    if self.eps_decay_steps < 0:
      raise ConfigError(f"eps_decay_steps must be >= 0, got {self.eps_decay_steps}.")


class QLambdaBatch(NamedTuple):
  """Flat transitions of one iteration, leaves ``[M, ...]`` (a minibatch, or all of them).

  Attributes:
    obs: observations ``[M, *obs_shape]``.
    action: actions taken ``[M]`` int32.
    target: Q(lambda) returns ``[M]``.
    mask: real transitions ``[M]`` (False: a pair across an episode boundary).
  """

  obs: jnp.ndarray
  action: jnp.ndarray
  target: jnp.ndarray
  mask: jnp.ndarray


def q_lambda_returns(reward_t: jnp.ndarray, discount_t: jnp.ndarray, mask_t: jnp.ndarray,
                     q_t: jnp.ndarray, q_lambda: float) -> jnp.ndarray:
  """Peng's Q(lambda) returns ``[T, N]`` of an unroll's pairs.

  Args:
    reward_t: reward of the pair ``t -> t + 1``, ``[T, N]``.
    discount_t: ``gamma`` times the env's discount at ``t + 1``, ``[T, N]`` (0: terminated).
    mask_t: the pair is a real transition, ``[T, N]`` bool (False: from an episode's last
      observation to the next one's reset observation).
    q_t: Q-values of the pair's next observation ``s_{t+1}``, ``[T, N, A]``.
    q_lambda: lambda in [0, 1].

  Returns:
    ``G_t = r_t + d_t ((1 - l_t) max_a q_t + l_t G_{t+1})``, bootstrapped with ``max_a q``
    at the unroll's end, ``l_t = q_lambda`` except 0 where pair ``t + 1`` is no transition
    (so no return flows back across an episode boundary). Entries of masked pairs are
    meaningless.
  """
  chex.assert_rank([reward_t, discount_t, mask_t, q_t], [2, 2, 2, 3])
  chex.assert_equal_shape([reward_t, discount_t, mask_t])
  chex.assert_equal_shape_prefix([reward_t, q_t], 2)
  into_next = jnp.concatenate([mask_t[1:], jnp.ones_like(mask_t[:1])], axis=0)
  lambdas = q_lambda * into_next.astype(jnp.float32)
  v_t = jnp.max(q_t, axis=-1)
  return jax.vmap(rlax.lambda_returns, in_axes=1, out_axes=1)(
      reward_t.astype(jnp.float32), discount_t.astype(jnp.float32), v_t, lambdas)


def q_lambda_loss(q_tm1: jnp.ndarray, batch: QLambdaBatch, huber_delta: float = 0.0
                  ) -> tuple[jnp.ndarray, dict]:
  """``0.5 (Q(s, a) - G)^2`` averaged over the real transitions of a minibatch, or the Huber
  loss of the error when ``huber_delta`` > 0 (quadratic up to it, linear beyond); ``q_tm1``
  the network's Q-values ``[M, A]`` at ``batch.obs``."""
  chex.assert_rank(q_tm1, 2)
  q_a = jnp.take_along_axis(q_tm1, batch.action[:, None], axis=-1)[:, 0]
  td = jax.lax.stop_gradient(batch.target) - q_a
  per_item = rlax.huber_loss(td, huber_delta) if huber_delta > 0 else rlax.l2_loss(td)
  loss = masked_mean(per_item, batch.mask)
  return loss, {"loss": loss, "q_mean": masked_mean(q_a, batch.mask),
                "target_mean": masked_mean(batch.target, batch.mask)}


# The learner's state: params, opt_state, opt_steps (iterations taken) and key (the minibatch
# shuffles); PQN keeps nothing more.
PQNState = LearnerState


class PQN(EpsilonGreedyActing, Agent):
  """PQN for Box observations and Discrete actions, on unrolls from a queue.

  Args:
    config: hyperparameters.
    obs_space: one sub-env's observation space (a ``Box``).
    action_space: one sub-env's action space (``Discrete``).
    env_id: named in error messages.
  """

  def __init__(self, config: PQNConfig, obs_space: gym.Space, action_space: gym.Space,
               env_id: str = "the env"):
    if not isinstance(action_space, gym.spaces.Discrete):
      raise ConfigError(
          f"{env_id} has action space {action_space}; PQN needs a Discrete action space. "
          "Use a discrete env, or a continuous-control algorithm.")
    check_box_observations(obs_space, env_id, "PQN")
    config.validate()
    check_torso(config.torso, obs_space.shape, env_id)
    self.keep_config(config, obs_space, action_space)
    self.num_actions = int(action_space.n)
    torso = (default_torso(obs_space.shape, obs_space.dtype) if config.torso == "auto"
             else config.torso)
    self.network = QNetwork(num_actions=self.num_actions, torso=torso,
                            hidden_sizes=tuple(config.hidden_sizes),
                            layer_norm=config.layer_norm)
    # The optimizer steps once per minibatch: num_epochs * num_minibatches per iteration.
    self.optimizer = adam_with_clipping(
        config.learning_rate, config.adam_eps, config.max_grad_norm,
        config.learning_rate_decay_steps * config.num_epochs * config.num_minibatches)
    self.greedy_actions = jax.jit(
        lambda params, obs: jnp.argmax(self.network.apply(params, obs), -1).astype(jnp.int32))
    self._jitted_update = jax.jit(self._update, donate_argnums=0)

  # --- init / params -------------------------------------------------------
  def init(self, key: chex.PRNGKey) -> PQNState:
    # numpy: jnp.zeros would warn of a float64 space (MuJoCo's) that JAX truncates anyway.
    obs = np.zeros((1,) + self.obs_space.shape, self.obs_space.dtype)
    params = self.network.init(key, obs)
    return PQNState(params=params, opt_state=self.optimizer.init(params),
                    opt_steps=jnp.zeros((), jnp.int32), key=key_data(jax.random.fold_in(key, 1)))

  @staticmethod
  def policy_params(state: PQNState) -> PyTree:
    return state.params

  # --- acting (epsilon-greedy: EpsilonGreedyActing) -------------------------
  def policy(self, params: PyTree, obs: np.ndarray, rng: np.random.Generator,
             explore: bool = True) -> np.ndarray:
    """The greedy actions ``[B]`` (before epsilon): one jitted call on ``params``' device."""
    return np.asarray(self.greedy_actions(params, obs))

  def divergence_hint(self) -> str:
    return (f"Lower the learning rate (now {self.config.learning_rate:g}), keep "
            "layer_norm=True, or check the env's rewards and observations for NaN or huge "
            "values.")

  # --- learning ------------------------------------------------------------
  def iteration_batch(self, params: PyTree, unroll: Unroll) -> QLambdaBatch:
    """The flat ``[T * N]`` transitions of ``unroll`` (leaves ``[T + 1, N, ...]``) with their
    Q(lambda) returns from ``params`` (held constant for the iteration)."""
    obs = unroll.obs
    q = jax.lax.stop_gradient(self.network.apply(params, batch_major(obs)))
    q = jnp.swapaxes(q.reshape(obs.shape[1::-1] + q.shape[1:]), 0, 1)  # [T + 1, N, A]
    mask = ~unroll.first[1:]
    discount = unroll.discount[1:]
    if self.config.truncation_as_termination:
      discount = discount * ~unroll.last[1:]
    target = q_lambda_returns(unroll.reward[1:], self.config.gamma * discount,
                              mask, q[1:], self.config.q_lambda)
    return QLambdaBatch(obs=batch_major(obs[:-1]),
                        action=batch_major(unroll.action[:-1].astype(jnp.int32)),
                        target=batch_major(target), mask=batch_major(mask))

  def loss(self, params: PyTree, batch: QLambdaBatch) -> tuple[jnp.ndarray, dict]:
    q_tm1 = self.network.apply(params, batch.obs)
    loss, metrics = q_lambda_loss(q_tm1, batch, self.config.huber_delta)
    return loss, {**metrics, **greedy_q_metrics(jax.lax.stop_gradient(q_tm1))}

  def _iteration(self, state: PQNState, unroll: Unroll):
    c = self.config
    data = self.iteration_batch(state.params, unroll)
    key, shuffle_key = jax.random.split(state.key)
    (params, opt_state), metrics = minibatch_epochs(
        self.loss, self.optimizer, state.params, state.opt_state, data, shuffle_key,
        c.num_epochs, c.num_minibatches, "PQN")
    return PQNState(params=params, opt_state=opt_state, opt_steps=state.opt_steps + 1,
                    key=key), jax.tree.map(jnp.mean, metrics)

  def update(self, state: PQNState, batch: Unroll, weights=None
             ) -> tuple[PQNState, dict, None]:
    """``k`` iterations, one per batch of unrolls (leaves ``[k, T + 1, N, ...]``), jitted,
    ``state`` donated; metrics averaged; no feedback."""
    return self._jitted_update(state, batch)

  def _update(self, state: PQNState, batch: Unroll):
    state, metrics = jax.lax.scan(self._iteration, state, batch)
    return state, jax.tree.map(jnp.mean, metrics), None

