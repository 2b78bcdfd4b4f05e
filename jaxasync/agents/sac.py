"""Soft Actor-Critic (Haarnoja et al. 2018, the automatic-temperature version) as an ``Agent``.

A tanh-squashed Gaussian policy, twin Q critics with Polyak-averaged targets and an entropy
temperature tuned towards a target entropy (``-|A|`` by default), for Box observations and a
one-axis Box of actions. It learns from n-step transitions in a replay, exactly as DQN does,
so the step processor's handling of terminated vs truncated episodes carries over: a
terminated transition has ``discount = 0``, a truncated one bootstraps from the true final
observation with ``gamma^m``.

The contract's pieces:
  * ``policy(params, obs, rng, explore)``: one jitted call returning env actions ``[B, A]``: a
    sample of the squashed Gaussian (its key seeded from the numpy ``rng``), or with
    ``explore=False`` the deterministic ``tanh(mean)`` (evaluation);
  * ``select``: passes them through (the policy explores by itself), but for uniform random
    actions over the Box while the run's env steps are inside the data's ``warmup_period``
    (``random_warmup``, as the paper, SB3 and CleanRL);
  * ``update``: ``k`` SGD steps per jitted call (``lax.scan``); each is a critic step, then,
    every ``policy_delay`` steps, an actor step and a temperature step, then a Polyak step of
    the target critics. Its feedback is ``|TD|`` per item (mean of the two critics), so a
    prioritized replay works too.

Actions: the networks work in ``[-1, 1]^A``; ``scale_actions`` maps those to the Box's own
bounds (asymmetric ones too) for the env and the replay, ``unscale_actions`` maps stored
actions back for the critics. Log-probabilities and the target entropy are those of the
``[-1, 1]`` actions (as in SB3 and CleanRL), so ``-|A|`` means the same for every Box.

n-step returns: the entropy bonus is taken at the bootstrap state only,
``y = R^(n) + gamma^m (min_i Q'_i(s', a') - alpha log pi(a'|s'))`` (SB3's n-step SAC does the
same); with ``n_step=1`` this is the paper's target.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import chex
import flax
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxasync.agent import key_data
from jaxasync.agents.continuous import (ContinuousAgent, ContinuousConfig, ExplorationState,
                                        GaussianPolicy, TwinQCritic, advanced, every_nth_step,
                                        scale_actions, squashed_gaussian, twin_td_loss,
                                        unscale_actions, warming_up)
from jaxasync.agents.optimizers import adam_with_clipping
from jaxasync.errors import ConfigError, check_positive
from jaxasync.types import Transition

PyTree = Any


@dataclasses.dataclass(frozen=True)
class SACConfig(ContinuousConfig):
  """Hyperparameters of the SAC learner.

  Attributes:
    actor_learning_rate: Adam step size of the policy.
    critic_learning_rate: Adam step size of the critics.
    temperature_learning_rate: Adam step size of log(alpha).
    adam_eps: Adam epsilon (all three optimizers).
    tau: Polyak factor of the target critics per SGD step.
    init_temperature: alpha at step 0.
    autotune_temperature: tune alpha towards target_entropy; False keeps init_temperature.
    target_entropy: entropy (of the [-1, 1] actions) alpha is tuned towards; None: -|A|.
    policy_delay: critic steps per actor (and temperature) step; 1: every step (the paper's).
    log_std_min: lower bound of the policy's log standard deviation (before the tanh).
    log_std_max: upper bound of the policy's log standard deviation.
    data: what it learns from (``ReplayConfig``; 1-step returns by default, the paper's soft
      Bellman target).
  """

  # The fields shared with TD3 are ContinuousConfig's (the docstring above describes those whose
  # meaning is SAC's own; --help reads it first); redeclared here: SAC's defaults.
  actor_learning_rate: float = 1e-3
  critic_learning_rate: float = 1e-3
  temperature_learning_rate: float = 1e-3
  init_temperature: float = 1.0
  autotune_temperature: bool = True
  target_entropy: float | None = None
  log_std_min: float = -5.0
  log_std_max: float = 2.0

  def validate(self) -> None:
    super().validate()
    check_positive(self, ("temperature_learning_rate", "init_temperature"))
    if not self.log_std_min < self.log_std_max:
      raise ConfigError(f"log_std_min={self.log_std_min} must be below "
                        f"log_std_max={self.log_std_max}.")


@flax.struct.dataclass
class SACState:
  """The learner's state: a pytree (checkpointed leaf by leaf)."""

  actor_params: PyTree
  critic_params: PyTree  # twin critics: every leaf has a leading axis of 2
  target_critic_params: PyTree
  log_temperature: jnp.ndarray  # float32 scalar: log(alpha)
  actor_opt_state: PyTree
  critic_opt_state: PyTree
  temperature_opt_state: PyTree
  opt_steps: jnp.ndarray  # int32 scalar: SGD (critic) steps taken
  key: jnp.ndarray  # uint32[2] PRNG key data, split per SGD step


# --- the maths, as small pure functions (tested against hand computations) ---------------

def soft_q_target(reward: chex.Array, discount: chex.Array, next_q: chex.Array,
                  next_log_prob: chex.Array, temperature: chex.Numeric) -> chex.Array:
  """The soft Bellman target ``r + discount * (min_i Q'_i(s', a') - alpha log pi(a'|s'))``.

  Args:
    reward: n-step rewards ``[B]``.
    discount: ``gamma^m``, or 0 where the episode terminated, ``[B]``.
    next_q: the target critics at ``(s', a')``, ``[2, B]``, ``a' ~ pi(.|s')``.
    next_log_prob: ``log pi(a'|s')``, ``[B]``.
    temperature: alpha, a scalar.

  Returns:
    Targets ``[B]``.
  """
  return reward + discount * (jnp.min(next_q, axis=0) - temperature * next_log_prob)


def actor_objective(log_prob: chex.Array, q: chex.Array, temperature: chex.Numeric) -> chex.Array:
  """The policy loss ``mean(alpha log pi(a|s) - min_i Q_i(s, a))``, ``a ~ pi(.|s)``
  reparameterized; ``log_prob`` ``[B]``, ``q`` ``[2, B]``."""
  return jnp.mean(temperature * log_prob - jnp.min(q, axis=0))


def temperature_loss(log_temperature: chex.Numeric, log_prob: chex.Array,
                     target_entropy: float) -> chex.Array:
  """``-log(alpha) * (mean(log pi) + target_entropy)``: its gradient raises alpha while the
  policy's entropy ``-mean(log pi)`` is below the target and lowers it above."""
  return -log_temperature * jax.lax.stop_gradient(jnp.mean(log_prob) + target_entropy)


class SAC(ContinuousAgent):
  """Soft Actor-Critic for Box observations and a one-axis, bounded Box of actions.

  Args:
    config: hyperparameters.
    obs_space: one sub-env's observation space (a ``Box``).
    action_space: one sub-env's action space (a ``Box`` of shape ``[A]``, finite bounds).
    env_id: named in error messages.
  """

  name = "SAC"
  # The metrics of the policy step, averaged over the SGD steps that took one (policy_delay).
  policy_metrics = ("actor_loss", "entropy", "actor_grad_norm")

  def __init__(self, config: SACConfig, obs_space: gym.Space, action_space: gym.Space,
               env_id: str = "the env"):
    torso, hidden = self.setup(config, obs_space, action_space, env_id)
    self.target_entropy = (float(config.target_entropy) if config.target_entropy is not None
                           else -float(self.action_dim))
    self.actor = GaussianPolicy(self.action_dim, torso, hidden, config.log_std_min,
                                config.log_std_max)
    self.critic = TwinQCritic(torso, hidden)

    self.actor_optimizer = adam_with_clipping(config.actor_learning_rate, config.adam_eps,
                                              config.max_grad_norm)
    self.critic_optimizer = adam_with_clipping(config.critic_learning_rate, config.adam_eps,
                                               config.max_grad_norm)
    self.temperature_optimizer = optax.adam(config.temperature_learning_rate, eps=config.adam_eps)
    self.sample_actions = jax.jit(self._sample_actions)
    self.mean_actions = jax.jit(self._mean_actions)

  # --- init / params -------------------------------------------------------
  def init(self, key: chex.PRNGKey) -> SACState:
    """The initial state; ``key`` (``jax.random.PRNGKey``) seeds the params and the update's
    sampling."""
    k_actor, k_critic, k_update = jax.random.split(key, 3)
    # numpy: jnp.zeros would warn of a float64 space (MuJoCo's) that JAX truncates anyway.
    obs = np.zeros((1,) + self.obs_space.shape, self.obs_space.dtype)
    action = jnp.zeros((1, self.action_dim), jnp.float32)
    actor_params = self.actor.init(k_actor, obs)
    critic_params = self.critic.init(k_critic, obs, action)
    log_temperature = jnp.asarray(np.log(self.config.init_temperature), jnp.float32)
    return SACState(
        actor_params=actor_params, critic_params=critic_params,
        target_critic_params=jax.tree.map(jnp.copy, critic_params),
        log_temperature=log_temperature,
        actor_opt_state=self.actor_optimizer.init(actor_params),
        critic_opt_state=self.critic_optimizer.init(critic_params),
        temperature_opt_state=self.temperature_optimizer.init(log_temperature),
        opt_steps=jnp.zeros((), jnp.int32), key=key_data(k_update))

  @staticmethod
  def policy_params(state: SACState) -> PyTree:
    """The policy's params: all actors need."""
    return state.actor_params

  # --- acting --------------------------------------------------------------
  def _sample_actions(self, params: PyTree, obs: jnp.ndarray, seed: jnp.ndarray) -> jnp.ndarray:
    mean, log_std = self.actor.apply(params, obs)
    action = squashed_gaussian(mean, log_std).sample(seed=jax.random.PRNGKey(seed))
    return self._to_env(action)

  def _mean_actions(self, params: PyTree, obs: jnp.ndarray) -> jnp.ndarray:
    mean, _ = self.actor.apply(params, obs)
    return self._to_env(jnp.tanh(mean))

  def _to_env(self, action: jnp.ndarray) -> jnp.ndarray:
    # Clipped: float32 rounding of low + (a + 1) / 2 * (high - low) can leave the Box by an ulp.
    return jnp.clip(scale_actions(action, self.low, self.high), self.low, self.high)

  def policy(self, params: PyTree, obs: np.ndarray, rng: np.random.Generator,
             explore: bool = True) -> np.ndarray:
    """Env actions ``[B, A]``: sampled from the policy (a fresh key seeded from ``rng``), or,
    with ``explore=False``, the deterministic ``tanh(mean)`` scaled to the Box."""
    if explore:
      seed = np.uint32(rng.integers(2 ** 31))
      return np.asarray(self.sample_actions(params, obs, seed))
    return np.asarray(self.mean_actions(params, obs))

  def select(self, actions: np.ndarray, actor_state: ExplorationState | None,
             rng: np.random.Generator) -> tuple[np.ndarray, None, ExplorationState | None]:
    """``policy``'s actions (its own noise explores), or uniform random ones over the Box
    during the random warmup; in the action space's dtype; no extras. (``actor_state`` None:
    a lock-step checkpoint from before the warmup existed, resumed past it.)"""
    if actor_state is not None and actor_state.explore:
      if warming_up(actor_state):
        uniform = rng.uniform(-1.0, 1.0, actions.shape).astype(np.float32)
        actions = np.clip(scale_actions(uniform, self.low, self.high), self.low, self.high)
      actor_state = advanced(actor_state)
    return actions.astype(self.action_space.dtype, copy=False), None, actor_state

  # --- learning ------------------------------------------------------------
  def critic_loss(self, critic_params: PyTree, state: SACState, batch: Transition,
                  weights: jnp.ndarray, key: chex.PRNGKey
                  ) -> tuple[jnp.ndarray, tuple[jnp.ndarray, dict]]:
    """``0.5 * sum_i mean_b w_b (Q_i(s_b, a_b) - y_b)^2`` with ``y`` the soft target of
    ``state``'s target critics and temperature; aux: ``|TD|`` ``[B]`` (mean of the two critics)
    and metrics."""
    temperature = jnp.exp(state.log_temperature)
    mean, log_std = self.actor.apply(state.actor_params, batch.next_obs)
    next_action, next_log_prob = squashed_gaussian(mean, log_std).sample_and_log_prob(seed=key)
    next_q = self.critic.apply(state.target_critic_params, batch.next_obs, next_action)
    target = jax.lax.stop_gradient(
        soft_q_target(batch.reward, batch.discount, next_q, next_log_prob, temperature))
    q = self.critic.apply(critic_params, batch.obs,
                          unscale_actions(batch.action, self.low, self.high))
    loss, abs_td = twin_td_loss(q, target, weights)
    return loss, (jax.lax.stop_gradient(abs_td),
                  {"critic_loss": loss, "q_mean": jnp.mean(q),
                   # (the twins' minimum: the value the target and the actor use, as DQN's
                   # ensemble; compared with the replay's q_bound)
                   "q_max": jnp.max(jnp.min(q, axis=0))})

  def actor_loss(self, actor_params: PyTree, critic_params: PyTree, temperature: jnp.ndarray,
                 obs: jnp.ndarray, key: chex.PRNGKey) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``actor_objective`` of reparameterized samples ``a ~ pi(.|s)``; aux: ``log pi(a|s)``
    ``[B]``."""
    mean, log_std = self.actor.apply(actor_params, obs)
    action, log_prob = squashed_gaussian(mean, log_std).sample_and_log_prob(seed=key)
    q = self.critic.apply(critic_params, obs, action)
    return actor_objective(log_prob, q, temperature), log_prob

  def _policy_step(self, state: SACState, critic_params: PyTree, obs: jnp.ndarray,
                   key: chex.PRNGKey) -> tuple[PyTree, PyTree, jnp.ndarray, PyTree, dict]:
    """One actor step (against the freshly updated critics) and one temperature step."""
    temperature = jnp.exp(state.log_temperature)
    (loss, log_prob), grads = jax.value_and_grad(self.actor_loss, has_aux=True)(
        state.actor_params, critic_params, temperature, obs, key)
    updates, actor_opt_state = self.actor_optimizer.update(grads, state.actor_opt_state,
                                                           state.actor_params)
    actor_params = optax.apply_updates(state.actor_params, updates)
    log_temperature, temperature_opt_state = state.log_temperature, state.temperature_opt_state
    if self.config.autotune_temperature:
      t_grad = jax.grad(temperature_loss)(state.log_temperature, log_prob, self.target_entropy)
      t_update, temperature_opt_state = self.temperature_optimizer.update(
          t_grad, state.temperature_opt_state)
      log_temperature = optax.apply_updates(state.log_temperature, t_update)
    metrics = {"actor_loss": loss, "entropy": -jnp.mean(log_prob),
               "actor_grad_norm": optax.tree.norm(grads)}  # (before clipping)
    return actor_params, actor_opt_state, log_temperature, temperature_opt_state, metrics

  def _sgd_step(self, state: SACState, inputs) -> tuple[SACState, tuple]:
    batch, weights = inputs
    c = self.config
    key, k_critic, k_actor = jax.random.split(state.key, 3)
    (_, (abs_td, metrics)), grads = jax.value_and_grad(self.critic_loss, has_aux=True)(
        state.critic_params, state, batch, weights, k_critic)
    updates, critic_opt_state = self.critic_optimizer.update(grads, state.critic_opt_state,
                                                             state.critic_params)
    critic_params = optax.apply_updates(state.critic_params, updates)

    def policy_step(_):
      return self._policy_step(state, critic_params, batch.obs, k_actor)

    def skip(_):
      return (state.actor_params, state.actor_opt_state, state.log_temperature,
              state.temperature_opt_state, self.skipped_policy_metrics())

    (actor_params, actor_opt, log_t, t_opt, policy_metrics), updated = every_nth_step(
        c.policy_delay, state.opt_steps, policy_step, skip)
    target = optax.incremental_update(critic_params, state.target_critic_params, c.tau)
    metrics = dict(metrics, **policy_metrics, temperature=jnp.exp(log_t),
                   critic_grad_norm=optax.tree.norm(grads))
    new_state = SACState(
        actor_params=actor_params, critic_params=critic_params, target_critic_params=target,
        log_temperature=log_t, actor_opt_state=actor_opt, critic_opt_state=critic_opt_state,
        temperature_opt_state=t_opt, opt_steps=state.opt_steps + 1, key=key)
    return new_state, (abs_td, metrics, updated)
