"""PPO (Schulman et al. 2017) on unrolls from actors that may run ahead (Sebulba-style).

One "SGD step" of the loop is one PPO iteration on one batch of unrolls: advantages by GAE
(``rlax.truncated_generalized_advantage_estimation``, vmapped over the batch) from the
learner's current values, then ``num_epochs`` passes of ``num_minibatches`` shuffled
minibatches of the clipped surrogate objective. The ratio's denominator is the behaviour
policy the actor acted with (its distribution's parameters come with the unroll: the logits,
or a Gaussian's mean and log-std with the unclipped sample), so an unroll made by older
params is corrected by the same clipping; the policy lag is recorded, and unrolls older than
``max_policy_lag`` are dropped by the queue.

Episode boundaries inside an unroll: the pair from an episode's last observation to the next
one's reset observation is masked out of every loss, and GAE's lambda is 0 into it, so no
advantage flows from one episode into the previous. A terminated episode's last pair has
discount 0; a truncated one's bootstraps from ``V`` of the true final observation.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, NamedTuple

import chex
import gymnasium as gym
import jax
import jax.numpy as jnp
import rlax
import tyro

from jaxasync.agents.minibatches import minibatch_epochs
from jaxasync.agents.optimizers import adam_with_clipping
from jaxasync.agents.actor_critic import (ActorCritic, ActorCriticConfig, ActorCriticState,
                                          PolicyHead, batch_major, masked_mean,
                                          masked_standardize, unroll_pairs)
from jaxasync.collectors.unrolls import Unroll
from jaxasync.errors import ConfigError
from jaxasync.pipeline import UnrollConfig

PyTree = Any


@dataclasses.dataclass(frozen=True)
class PPOConfig(ActorCriticConfig):
  """Hyperparameters of the PPO learner: ActorCriticConfig's (here: 32-step unrolls, one
  per iteration, Adam eps 1e-5, a gradient clip of 0.5, no entropy bonus; the learning-rate
  decay counts iterations) and:

  Attributes:
    gae_lambda: GAE's lambda.
    num_epochs: passes over each batch.
    num_minibatches: minibatches per pass; the batch's T x N transitions must divide by it.
    clip_epsilon: the surrogate's ratio clip.
    value_clip_epsilon: clip of the value's change from its value at the iteration's start;
      0: no value clipping.
    value_cost: weight of the value loss.
    normalize_advantages: standardize advantages per minibatch.
  """

  batch_size: int = 1
  adam_eps: float = 1e-5
  max_grad_norm: float = 0.5
  entropy_cost: float = 0.0
  gae_lambda: float = 0.95
  num_epochs: int = 10
  num_minibatches: int = 1
  clip_epsilon: float = 0.2
  value_clip_epsilon: float = 0.0
  value_cost: float = 0.5
  normalize_advantages: bool = True
  data: Annotated[UnrollConfig, tyro.conf.arg(name="")] = dataclasses.field(
      default_factory=lambda: UnrollConfig(unroll_length=32))

  def validate(self) -> None:
    super().validate()
    if not 0.0 <= self.gae_lambda <= 1.0:
      raise ConfigError(f"gae_lambda must be in [0, 1], got {self.gae_lambda}.")
    if self.num_epochs < 1 or self.num_minibatches < 1:
      raise ConfigError(f"num_epochs and num_minibatches must be >= 1, got {self.num_epochs} "
                        f"and {self.num_minibatches}.")
    if not self.clip_epsilon > 0 or not self.value_clip_epsilon >= 0:
      raise ConfigError("clip_epsilon must be > 0 and value_clip_epsilon >= 0 (0: none).")


class PPOBatch(NamedTuple):
  """Flat transitions of one iteration, leaves ``[M, ...]`` (a minibatch, or all of them).

  Attributes:
    obs: observations ``[M, *obs_shape]``.
    action: actions taken, as the head's ``log_prob`` takes them (``[M]``; Gaussian: the
      unclipped samples ``[M, A]``).
    behaviour_log_prob: ``log mu(a|x)`` of the policy the actor acted with ``[M]``.
    advantage: GAE advantages ``[M]``.
    value_target: ``advantage + V_old`` ``[M]``.
    old_value: the value at the iteration's start ``[M]`` (for value clipping).
    mask: real transitions ``[M]`` (False: a pair across an episode boundary).
  """

  obs: jnp.ndarray
  action: jnp.ndarray
  behaviour_log_prob: jnp.ndarray
  advantage: jnp.ndarray
  value_target: jnp.ndarray
  old_value: jnp.ndarray
  mask: jnp.ndarray


def gae_advantages(pairs, values: jnp.ndarray, gae_lambda: float) -> jnp.ndarray:
  """GAE advantages ``[T, N]`` of an unroll's ``pairs`` and its values ``[T + 1, N]``.

  Lambda is 0 from a pair into the next one when that one is a non-transition (an episode
  boundary), so ``A_t = delta_t`` at an episode's last pair: its own bootstrap (discount 0 if
  terminated) and nothing from the next episode.
  """
  into_next = jnp.concatenate([pairs.mask[1:], jnp.ones_like(pairs.mask[:1])], axis=0)
  lambdas = gae_lambda * into_next.astype(jnp.float32)
  return jax.vmap(rlax.truncated_generalized_advantage_estimation, in_axes=1, out_axes=1)(
      pairs.reward, pairs.discount, lambdas, values)


MAX_LOG_RATIO = 20.0  # |log pi - log mu| beyond which a sample's ratio is held (see ppo_losses)


def ppo_losses(dist_params, values: jnp.ndarray, batch: PPOBatch, config: PPOConfig,
               head: PolicyHead) -> tuple[jnp.ndarray, dict]:
  """The clipped-surrogate loss on a minibatch from the learner's dist params (leaves
  ``[M, X]``: ``head``'s) and ``values [M]``; returns the loss and its parts (means over the
  real transitions)."""
  chex.assert_rank(values, 1)
  log_pi = head.log_prob(dist_params, batch.action)
  # Bounded: a Gaussian's log-probability of a lagged sample can move by hundreds, float32's
  # exp overflows at 88.7, and inf times a negative advantage made the loss and every
  # gradient NaN. exp(20) is far past any clip; beyond it a sample gives no gradient.
  log_ratio = jnp.clip(log_pi - batch.behaviour_log_prob, -MAX_LOG_RATIO, MAX_LOG_RATIO)
  ratio = jnp.exp(log_ratio)
  advantage = batch.advantage
  if config.normalize_advantages:
    advantage = masked_standardize(advantage, batch.mask)
  eps = config.clip_epsilon
  surrogate = jnp.minimum(ratio * advantage, jnp.clip(ratio, 1 - eps, 1 + eps) * advantage)
  pg_loss = -masked_mean(surrogate, batch.mask)
  value_error = jnp.square(values - batch.value_target)
  if config.value_clip_epsilon:
    vc = config.value_clip_epsilon
    clipped = batch.old_value + jnp.clip(values - batch.old_value, -vc, vc)
    value_error = jnp.maximum(value_error, jnp.square(clipped - batch.value_target))
  value_loss = masked_mean(0.5 * value_error, batch.mask)
  entropy = masked_mean(head.entropy(dist_params), batch.mask)
  loss = pg_loss + config.value_cost * value_loss - config.entropy_cost * entropy
  return loss, {"loss": loss, "pg_loss": pg_loss, "value_loss": value_loss,
                "entropy": entropy,
                "approx_kl": masked_mean((ratio - 1.0) - log_ratio, batch.mask),
                "clip_fraction": masked_mean((jnp.abs(ratio - 1.0) > eps).astype(jnp.float32),
                                             batch.mask)}


class PPO(ActorCritic):
  """PPO with GAE and a clipped surrogate, for Box observations and Discrete actions (a
  categorical policy) or a one-axis Box of actions (a diagonal Gaussian with a
  state-independent log-std, actions clipped to the Box), on unrolls from a queue.

  Args:
    config: hyperparameters.
    obs_space: one sub-env's observation space (a ``Box``).
    action_space: one sub-env's action space (``Discrete``, or a bounded one-axis ``Box``).
    env_id: named in error messages.
  """

  def __init__(self, config: PPOConfig, obs_space: gym.Space, action_space: gym.Space,
               env_id: str = "the env"):
    config.validate()
    self._setup(config, obs_space, action_space, env_id, "PPO")
    # The optimizer steps once per minibatch: num_epochs * num_minibatches per iteration.
    self.optimizer = adam_with_clipping(
        config.learning_rate, config.adam_eps, config.max_grad_norm,
        config.learning_rate_decay_steps * config.num_epochs * config.num_minibatches)
    self._jitted_update = jax.jit(self._update, donate_argnums=0)

  def iteration_batch(self, params: PyTree, unroll: Unroll) -> PPOBatch:
    """The flat ``[T * N]`` transitions of ``unroll`` with advantages and value targets from
    ``params`` (held constant for the iteration); ``unroll.obs`` as the network takes them
    (normalised already, with ``normalize_observations``: ``normalize_unroll``)."""
    pairs = unroll_pairs(unroll, self.config.gamma, self.head)
    _, values = self.apply_unroll(params, unroll.obs)
    values = jax.lax.stop_gradient(values)
    advantage = gae_advantages(pairs, values, self.config.gae_lambda)
    flat = batch_major
    return PPOBatch(obs=flat(unroll.obs[:-1]), action=flat(pairs.action),
                    behaviour_log_prob=flat(self.head.log_prob(pairs.behaviour, pairs.action)),
                    advantage=flat(advantage), value_target=flat(advantage + values[:-1]),
                    old_value=flat(values[:-1]), mask=flat(pairs.mask))

  def loss(self, params: PyTree, batch: PPOBatch) -> tuple[jnp.ndarray, dict]:
    dist_params, values = self.network.apply(params, batch.obs)
    return ppo_losses(dist_params, values, batch, self.config, self.head)

  def _iteration(self, state: ActorCriticState, unroll: Unroll):
    c = self.config
    # The observation statistics (if any) take this batch in first; the iteration's epochs
    # then all see its observations normalised by the same, updated statistics.
    state, unroll = self.normalize_unroll(state, unroll)
    data = self.iteration_batch(state.params, unroll)
    key, shuffle_key = jax.random.split(state.key)
    (params, opt_state), metrics = minibatch_epochs(
        self.loss, self.optimizer, state.params, state.opt_state, data, shuffle_key,
        c.num_epochs, c.num_minibatches, "PPO")
    metrics = jax.tree.map(jnp.mean, metrics)
    metrics["advantage_mean"] = masked_mean(data.advantage, data.mask)
    return state.replace(params=params, opt_state=opt_state, opt_steps=state.opt_steps + 1,
                         key=key), metrics

  def update(self, state: ActorCriticState, batch: Unroll, weights=None
             ) -> tuple[ActorCriticState, dict, None]:
    """``k`` PPO iterations, one per batch of unrolls (leaves ``[k, T + 1, N, ...]``),
    jitted, ``state`` donated; metrics averaged; no feedback."""
    return self._jitted_update(state, batch)

  def _update(self, state: ActorCriticState, batch: Unroll):
    state, metrics = jax.lax.scan(self._iteration, state, batch)
    return state, jax.tree.map(jnp.mean, metrics), None
