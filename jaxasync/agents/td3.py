"""TD3, Twin Delayed DDPG (Fujimoto et al. 2018, "Addressing Function Approximation Error in
Actor-Critic Methods"), as an ``Agent``.

A deterministic tanh policy, twin Q critics whose minimum is the target (clipped double Q),
target-policy smoothing (clipped Gaussian noise on the target actor's action) and delayed
actor and target updates, for Box observations and a one-axis, bounded Box of actions. It
learns from n-step transitions in a replay, as SAC and DQN do: a terminated transition has
``discount = 0``, a truncated one bootstraps from the true final observation with ``gamma^m``.

The contract's pieces:
  * ``policy(params, obs, rng, explore)``: one jitted call returning the deterministic actions
    ``[B, A]`` in ``[-1, 1]`` (the network's own space; ``rng`` and ``explore`` are unused: the
    network has no noise of its own);
  * ``select``: exploration in numpy on the actor, from its actor state: uniform random actions
    while the run's env steps are inside the data's ``warmup_period`` (``random_warmup``, as
    the paper and CleanRL), Gaussian noise of ``exploration_noise`` afterwards, none for the
    evaluator; then the actions are clipped to ``[-1, 1]`` and scaled to the Box's own bounds;
  * ``update``: ``k`` SGD steps per jitted call (``lax.scan``); each is a critic step, then,
    every ``policy_delay`` steps, an actor step against the freshly updated critics and a
    Polyak step of both target networks. Its feedback is ``|TD|`` per item (mean of the two
    critics), so a prioritized replay works too.

Noise, exploration's and the target smoothing's alike, is drawn in the normalised ``[-1, 1]``
action space (CleanRL scales it by the Box's half-width, which is the same), so the paper's
0.1, 0.2 and 0.5 mean the same for every Box.
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
from jaxasync.agents.continuous import (ContinuousAgent, ContinuousConfig,
                                        DeterministicPolicy, ExplorationState, QCritic,
                                        TwinQCritic, advanced, every_nth_step, one_twin,
                                        scale_actions, twin_td_loss, unscale_actions,
                                        warming_up)
from jaxasync.agents.optimizers import adam_with_clipping
from jaxasync.errors import ConfigError
from jaxasync.types import Transition

PyTree = Any


@dataclasses.dataclass(frozen=True)
class TD3Config(ContinuousConfig):
  """Hyperparameters of the TD3 learner and its exploration; the defaults are the authors'
  repository's (github.com/sfujim/TD3, as CleanRL's td3_continuous_action.py; the paper had
  400x300 networks, step size 1e-3 and batch 100), but for the replay's (data), which are the
  library's.

  Attributes:
    adam_eps: Adam epsilon (both optimizers).
    tau: Polyak factor of the target actor and critics per delayed update.
    policy_delay: critic steps per actor and target update (the paper's d).
    exploration_noise: std of the actors' Gaussian action noise, in [-1, 1] action units.
    target_noise: std of the target-policy smoothing noise, in [-1, 1] action units.
    target_noise_clip: the smoothing noise is clipped to [-c, c] before it is added.
    data: what it learns from (``ReplayConfig``; 1-step returns by default, the paper's target).
  """

  # The fields shared with SAC are ContinuousConfig's (the docstring above describes those whose
  # meaning is TD3's own; --help reads it first); redeclared here: TD3's default.
  policy_delay: int = 2
  exploration_noise: float = 0.1
  target_noise: float = 0.2
  target_noise_clip: float = 0.5

  def validate(self) -> None:
    super().validate()
    for name in ("exploration_noise", "target_noise", "target_noise_clip"):
      value = getattr(self, name)
      if not 0.0 <= value < float("inf"):
        raise ConfigError(f"{name} must be a finite number >= 0 (in [-1, 1] action units; 0: "
                          f"no noise), got {value}.")


@flax.struct.dataclass
class TD3State:
  """The learner's state: a pytree (checkpointed leaf by leaf)."""

  actor_params: PyTree
  critic_params: PyTree  # twin critics: every leaf has a leading axis of 2
  target_actor_params: PyTree
  target_critic_params: PyTree
  actor_opt_state: PyTree
  critic_opt_state: PyTree
  opt_steps: jnp.ndarray  # int32 scalar: SGD (critic) steps taken
  key: jnp.ndarray  # uint32[2] PRNG key data, split per SGD step (the smoothing noise)


# Lock-step checkpoints from before SAC shared it pickle the actor's state by this name.
TD3ActorState = ExplorationState


# --- the maths, as small pure functions (tested against hand computations) ---------------

def smoothed_target_actions(target_actions: chex.Array, noise: chex.Array, noise_std: float,
                            noise_clip: float) -> chex.Array:
  """Target-policy smoothing: ``clip(a' + clip(noise_std * noise, -c, c), -1, 1)``.

  Args:
    target_actions: the target actor's actions ``[B, A]`` in ``[-1, 1]``.
    noise: standard normal draws ``[B, A]``.
    noise_std: the smoothing noise's std (the paper's 0.2).
    noise_clip: ``c``, the bound of the noise (the paper's 0.5).

  Returns:
    Actions ``[B, A]`` in ``[-1, 1]``.
  """
  chex.assert_rank(target_actions, 2)
  chex.assert_equal_shape((target_actions, noise))
  clipped = jnp.clip(noise_std * noise, -noise_clip, noise_clip)
  return jnp.clip(target_actions + clipped, -1.0, 1.0)


def clipped_double_q_target(reward: chex.Array, discount: chex.Array,
                            next_q: chex.Array) -> chex.Array:
  """TD3's target ``r + discount * min_i Q'_i(s', a')``.

  Args:
    reward: n-step rewards ``[B]``.
    discount: ``gamma^m``, or 0 where the episode terminated, ``[B]``.
    next_q: the target critics at ``(s', a')``, ``[2, B]``, ``a'`` the smoothed target action.

  Returns:
    Targets ``[B]``.
  """
  chex.assert_rank((reward, discount, next_q), (1, 1, 2))
  chex.assert_equal_shape((reward, discount, next_q[0]))
  return reward + discount * jnp.min(next_q, axis=0)


def deterministic_actor_loss(q: chex.Array) -> chex.Array:
  """The policy loss ``-mean_b Q_1(s_b, pi(s_b))``: the first critic only, as the paper
  (``q`` ``[B]``)."""
  chex.assert_rank(q, 1)
  return -jnp.mean(q)


def exploration_actions(actions: np.ndarray, noise_std: float,
                        rng: np.random.Generator) -> np.ndarray:
  """``clip(a + N(0, noise_std^2), -1, 1)`` per element of ``actions`` ``[B, A]`` (numpy, on
  the actor)."""
  noisy = actions + rng.normal(0.0, noise_std, actions.shape).astype(actions.dtype)
  return np.clip(noisy, -1.0, 1.0)


class TD3(ContinuousAgent):
  """TD3 for Box observations and a one-axis, bounded Box of actions.

  Args:
    config: hyperparameters.
    obs_space: one sub-env's observation space (a ``Box``).
    action_space: one sub-env's action space (a ``Box`` of shape ``[A]``, finite bounds).
    env_id: named in error messages.
  """

  name = "TD3"
  # The metrics of the delayed actor step, averaged over the SGD steps that took one.
  policy_metrics = ("actor_loss", "actor_grad_norm")

  def __init__(self, config: TD3Config, obs_space: gym.Space, action_space: gym.Space,
               env_id: str = "the env"):
    torso, hidden = self.setup(config, obs_space, action_space, env_id)
    self.actor = DeterministicPolicy(self.action_dim, torso, hidden)
    self.critic = TwinQCritic(torso, hidden)
    self.first_critic = QCritic(torso, hidden)  # (one twin's params: the actor's objective)

    self.actor_optimizer = adam_with_clipping(config.actor_learning_rate, config.adam_eps,
                                              config.max_grad_norm)
    self.critic_optimizer = adam_with_clipping(config.critic_learning_rate, config.adam_eps,
                                               config.max_grad_norm)
    self.deterministic_actions = jax.jit(self.actor.apply)

  # --- init / params -------------------------------------------------------
  def init(self, key: chex.PRNGKey) -> TD3State:
    """The initial state; ``key`` (``jax.random.PRNGKey``) seeds the params and the update's
    smoothing noise. The targets start as copies of the online networks."""
    k_actor, k_critic, k_update = jax.random.split(key, 3)
    # numpy: jnp.zeros would warn of a float64 space (MuJoCo's) that JAX truncates anyway.
    obs = np.zeros((1,) + self.obs_space.shape, self.obs_space.dtype)
    action = jnp.zeros((1, self.action_dim), jnp.float32)
    actor_params = self.actor.init(k_actor, obs)
    critic_params = self.critic.init(k_critic, obs, action)
    return TD3State(
        actor_params=actor_params, critic_params=critic_params,
        target_actor_params=jax.tree.map(jnp.copy, actor_params),
        target_critic_params=jax.tree.map(jnp.copy, critic_params),
        actor_opt_state=self.actor_optimizer.init(actor_params),
        critic_opt_state=self.critic_optimizer.init(critic_params),
        opt_steps=jnp.zeros((), jnp.int32), key=key_data(k_update))

  @staticmethod
  def policy_params(state: TD3State) -> PyTree:
    """The (online) policy's params: all actors need."""
    return state.actor_params

  # --- acting --------------------------------------------------------------
  def policy(self, params: PyTree, obs: np.ndarray, rng: np.random.Generator,
             explore: bool = True) -> np.ndarray:
    """The deterministic actions ``[B, A]`` in ``[-1, 1]`` for ``obs`` ``[B, *obs_shape]``;
    ``select`` explores and scales them to the Box."""
    return np.asarray(self.deterministic_actions(params, obs))

  def select(self, actions: np.ndarray, actor_state: ExplorationState,
             rng: np.random.Generator) -> tuple[np.ndarray, None, ExplorationState]:
    """Env actions ``[B, A]`` (the Box's dtype) from ``policy``'s ``[-1, 1]`` actions: uniform
    random during the random warmup, with exploration noise after it, unchanged for the
    evaluator; scaled to the Box. No extras."""
    if actor_state.explore:
      if warming_up(actor_state):
        actions = rng.uniform(-1.0, 1.0, actions.shape).astype(np.float32)
      else:
        actions = exploration_actions(actions, self.config.exploration_noise, rng)
      actor_state = advanced(actor_state)
    # Clipped: float32 rounding of low + (a + 1) / 2 * (high - low) can leave the Box by an ulp.
    env_actions = np.clip(scale_actions(actions, self.low, self.high), self.low, self.high)
    return env_actions.astype(self.action_space.dtype, copy=False), None, actor_state

  # --- learning ------------------------------------------------------------
  def critic_loss(self, critic_params: PyTree, state: TD3State, batch: Transition,
                  weights: jnp.ndarray, key: chex.PRNGKey
                  ) -> tuple[jnp.ndarray, tuple[jnp.ndarray, dict]]:
    """``twin_td_loss`` against ``clipped_double_q_target`` of ``state``'s target critics at
    the target actor's smoothed action (its noise drawn with ``key``); stored actions are
    unscaled to ``[-1, 1]``. Aux: ``|TD|`` ``[B]`` and metrics."""
    next_action = self.actor.apply(state.target_actor_params, batch.next_obs)
    noise = jax.random.normal(key, next_action.shape, next_action.dtype)
    next_action = smoothed_target_actions(next_action, noise, self.config.target_noise,
                                          self.config.target_noise_clip)
    next_q = self.critic.apply(state.target_critic_params, batch.next_obs, next_action)
    target = clipped_double_q_target(batch.reward, batch.discount, next_q)
    q = self.critic.apply(critic_params, batch.obs,
                          unscale_actions(batch.action, self.low, self.high))
    loss, abs_td = twin_td_loss(q, target, weights)
    return loss, (jax.lax.stop_gradient(abs_td),
                  {"critic_loss": loss, "q_mean": jnp.mean(q),
                   # (the twins' minimum, what the target uses; compared with the replay's
                   # q_bound, as SAC's)
                   "q_max": jnp.max(jnp.min(q, axis=0))})

  def actor_loss(self, actor_params: PyTree, critic_params: PyTree, obs: jnp.ndarray
                 ) -> jnp.ndarray:
    """``deterministic_actor_loss`` of the first twin of ``critic_params`` at ``pi(s)``."""
    action = self.actor.apply(actor_params, obs)
    return deterministic_actor_loss(
        self.first_critic.apply(one_twin(critic_params, 0), obs, action))

  def _delayed_step(self, state: TD3State, critic_params: PyTree, obs: jnp.ndarray
                    ) -> tuple[PyTree, PyTree, PyTree, PyTree, dict]:
    """One actor step (against the freshly updated critics), then a Polyak step of the target
    actor (towards the new actor) and of the target critics (towards ``critic_params``)."""
    tau = self.config.tau
    loss, grads = jax.value_and_grad(self.actor_loss)(state.actor_params, critic_params, obs)
    updates, actor_opt_state = self.actor_optimizer.update(grads, state.actor_opt_state,
                                                           state.actor_params)
    actor_params = optax.apply_updates(state.actor_params, updates)
    target_actor = optax.incremental_update(actor_params, state.target_actor_params, tau)
    target_critic = optax.incremental_update(critic_params, state.target_critic_params, tau)
    metrics = {"actor_loss": loss, "actor_grad_norm": optax.tree.norm(grads)}  # (unclipped)
    return actor_params, actor_opt_state, target_actor, target_critic, metrics

  def _sgd_step(self, state: TD3State, inputs) -> tuple[TD3State, tuple]:
    batch, weights = inputs
    key, k_noise = jax.random.split(state.key)
    (_, (abs_td, metrics)), grads = jax.value_and_grad(self.critic_loss, has_aux=True)(
        state.critic_params, state, batch, weights, k_noise)
    updates, critic_opt_state = self.critic_optimizer.update(grads, state.critic_opt_state,
                                                             state.critic_params)
    critic_params = optax.apply_updates(state.critic_params, updates)

    def delayed_step(_):
      return self._delayed_step(state, critic_params, batch.obs)

    def skip(_):
      return (state.actor_params, state.actor_opt_state, state.target_actor_params,
              state.target_critic_params, self.skipped_policy_metrics())

    (actor_params, actor_opt, target_actor, target_critic, policy_metrics), updated = (
        every_nth_step(self.config.policy_delay, state.opt_steps, delayed_step, skip))
    metrics = dict(metrics, **policy_metrics, critic_grad_norm=optax.tree.norm(grads))
    new_state = TD3State(
        actor_params=actor_params, critic_params=critic_params,
        target_actor_params=target_actor, target_critic_params=target_critic,
        actor_opt_state=actor_opt, critic_opt_state=critic_opt_state,
        opt_steps=state.opt_steps + 1, key=key)
    return new_state, (abs_td, metrics, updated)
