"""IMPALA (Espeholt et al. 2018): an actor-critic corrected for policy lag by V-trace.

Actors run ahead of the learner with older params; each unroll carries the behaviour
policy (its logits, or a Gaussian's mean and log-std with the unclipped sample), and the
learner weighs every step by the clipped importance ratio
``rho = pi(a|x) / mu(a|x)`` (``rlax.vtrace_td_error_and_advantage``, vmapped over the batch).

Episode boundaries inside an unroll (``jaxasync.collectors.unrolls``): the pair from an
episode's last observation to the next one's reset observation is no transition; its ``rho``
(and so V-trace's ``c``) is set to 0, which makes ``vs = V`` there and cuts the recursion, so
nothing of the next episode flows back. A terminated episode's last pair has discount 0; a
truncated one's bootstraps from ``V`` of the true final observation.

The loss of one SGD step, means over the real transitions ``[T, N]``:
``pg + baseline_cost * 0.5 (vs - V)^2 - entropy_cost * H(pi)`` with
``pg = -rho_pg (r + gamma vs' - V) log pi(a|x)`` (advantages held constant).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import chex
import flax
import gymnasium as gym
import jax
import jax.numpy as jnp
import optax
import rlax

from jaxasync.agents.optimizers import adam_with_clipping
from jaxasync.agents.actor_critic import (ActorCritic, ActorCriticConfig, ActorCriticState,
                                          PolicyHead, masked_mean,
                                          masked_standardize, unroll_pairs)
from jaxasync.collectors.unrolls import Unroll
from jaxasync.errors import ConfigError

PyTree = Any


@dataclasses.dataclass(frozen=True)
class IMPALAConfig(ActorCriticConfig):
  """Hyperparameters of the IMPALA learner: ActorCriticConfig's (defaults: 20-step unrolls,
  2 per SGD step, Adam 1e-3, the paper's gradient clip of 40, entropy cost 0.01) and:

  Attributes:
    baseline_cost: weight of the value loss.
    vtrace_lambda: V-trace's lambda (1: the paper's).
    clip_rho_threshold: clip of the importance ratios in the value targets (rho-bar).
    clip_pg_rho_threshold: clip of the importance ratios in the policy gradient.
    normalize_advantages: standardize the policy gradient's advantages over each batch.
    target_kl_cost: weight of KL(pi_target || pi), the policy's divergence from a slow
      Polyak average of itself (PPO-EWMA's proximal policy, Hilton et al. 2022); 0: none
      (the paper's IMPALA).
    target_tau: the step of that average per SGD step (about 1 / tau steps of memory).
  """

  baseline_cost: float = 0.5
  vtrace_lambda: float = 1.0
  clip_rho_threshold: float = 1.0
  clip_pg_rho_threshold: float = 1.0
  normalize_advantages: bool = False
  target_kl_cost: float = 0.0
  target_tau: float = 0.005

  def validate(self) -> None:
    super().validate()
    if not 0.0 <= self.vtrace_lambda <= 1.0:
      raise ConfigError(f"vtrace_lambda must be in [0, 1], got {self.vtrace_lambda}.")
    if self.clip_rho_threshold <= 0 or self.clip_pg_rho_threshold <= 0:
      raise ConfigError("clip_rho_threshold and clip_pg_rho_threshold must be > 0.")
    if not 0.0 <= self.target_kl_cost < float("inf"):
      raise ConfigError(f"target_kl_cost must be a finite number >= 0 (0: no target policy), "
                        f"got {self.target_kl_cost}.")
    if not 0.0 < self.target_tau <= 1.0:
      raise ConfigError(f"target_tau must be in (0, 1], got {self.target_tau}.")


def vtrace_losses(dist_params, values: jnp.ndarray, pairs, config: IMPALAConfig,
                  head: PolicyHead) -> tuple[jnp.ndarray, dict]:
  """IMPALA's loss from the learner's dist params (leaves ``[T + 1, N, X]``: ``head``'s) and
  ``values [T + 1, N]`` on an unroll's ``pairs`` (``unroll_pairs`` with the same head);
  returns the loss and its parts."""
  chex.assert_rank(values, 2)
  dist_tm1 = jax.tree.map(lambda x: x[:-1], dist_params)
  log_pi = head.log_prob(dist_tm1, pairs.action)
  log_mu = head.log_prob(pairs.behaviour, pairs.action)
  # rho = 0 on non-transitions: no TD error there and c = 0, so the recursion stops.
  rho = jax.lax.stop_gradient(jnp.exp(log_pi - log_mu)) * pairs.mask
  vtrace = jax.vmap(
      lambda v_tm1, v_t, r_t, d_t, rho_tm1: rlax.vtrace_td_error_and_advantage(
          v_tm1, v_t, r_t, d_t, rho_tm1, config.vtrace_lambda, config.clip_rho_threshold,
          config.clip_pg_rho_threshold),
      in_axes=1, out_axes=1)(values[:-1], values[1:], pairs.reward, pairs.discount, rho)
  advantage = jax.lax.stop_gradient(vtrace.pg_advantage)
  if config.normalize_advantages:
    advantage = masked_standardize(advantage, pairs.mask)
  pg_loss = -masked_mean(advantage * log_pi, pairs.mask)
  baseline_loss = masked_mean(0.5 * jnp.square(vtrace.errors), pairs.mask)
  entropy = masked_mean(head.entropy(dist_tm1), pairs.mask)
  loss = pg_loss + config.baseline_cost * baseline_loss - config.entropy_cost * entropy
  return loss, {"loss": loss, "pg_loss": pg_loss, "baseline_loss": baseline_loss,
                "entropy": entropy, "rho_mean": masked_mean(rho, pairs.mask),
                "value_mean": masked_mean(values[:-1], pairs.mask)}


@flax.struct.dataclass
class IMPALAState(ActorCriticState):
  """``ActorCriticState`` and the target policy's params (None without ``target_kl_cost``)."""

  target_params: PyTree = None


class IMPALA(ActorCritic):
  """IMPALA with V-trace, for Box observations and Discrete actions (a categorical policy) or
  a one-axis Box of actions (a diagonal Gaussian, actions clipped to the Box), on unrolls from
  a queue.

  Args:
    config: hyperparameters.
    obs_space: one sub-env's observation space (a ``Box``).
    action_space: one sub-env's action space (``Discrete``, or a bounded one-axis ``Box``).
    env_id: named in error messages.
  """

  def __init__(self, config: IMPALAConfig, obs_space: gym.Space, action_space: gym.Space,
               env_id: str = "the env"):
    config.validate()
    self._setup(config, obs_space, action_space, env_id, "IMPALA")
    self.optimizer = adam_with_clipping(config.learning_rate, config.adam_eps,
                                        config.max_grad_norm, config.learning_rate_decay_steps)
    self._jitted_update = jax.jit(self._update, donate_argnums=0)

  def init(self, key: chex.PRNGKey) -> IMPALAState:
    """``ActorCritic.init``'s state, and the target policy starting at the params."""
    base = super().init(key)
    target = (jax.tree.map(jnp.copy, base.params) if self.config.target_kl_cost else None)
    return IMPALAState(**{f.name: getattr(base, f.name)
                          for f in dataclasses.fields(ActorCriticState)},
                       target_params=target)

  def loss(self, params: PyTree, unroll: Unroll, target_params: PyTree = None
           ) -> tuple[jnp.ndarray, dict]:
    """IMPALA's loss on one batch of unrolls (leaves ``[T + 1, N, ...]``, ``obs`` as the
    network takes them: ``normalize_unroll``'s), plus ``target_kl_cost`` times the policy's
    mean KL from ``target_params``' when given."""
    dist_params, values = self.apply_unroll(params, unroll.obs)
    pairs = unroll_pairs(unroll, self.config.gamma, self.head)
    loss, metrics = vtrace_losses(dist_params, values, pairs, self.config, self.head)
    if target_params is not None:
      target_dist, _ = self.apply_unroll(target_params, unroll.obs)
      target_tm1 = jax.lax.stop_gradient(jax.tree.map(lambda x: x[:-1], target_dist))
      dist_tm1 = jax.tree.map(lambda x: x[:-1], dist_params)
      target_kl = masked_mean(self.head.kl_divergence(target_tm1, dist_tm1), pairs.mask)
      loss = loss + self.config.target_kl_cost * target_kl
      metrics.update(loss=loss, target_kl=target_kl)
    return loss, metrics

  def _sgd_step(self, state: IMPALAState, unroll: Unroll):
    # The observation statistics (if any) take this batch in before the step that learns
    # from it; the loss sees its observations normalised by the updated statistics.
    state, unroll = self.normalize_unroll(state, unroll)
    grads, metrics = jax.grad(self.loss, has_aux=True)(state.params, unroll, state.target_params)
    updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
    metrics["grad_norm"] = optax.tree.norm(grads)
    params = optax.apply_updates(state.params, updates)
    target = state.target_params
    if target is not None:  # the target policy follows the params it anchors, slowly
      tau = self.config.target_tau
      target = jax.tree.map(lambda t, p: (1 - tau) * t + tau * p, target, params)
    return state.replace(params=params, target_params=target, opt_state=opt_state,
                         opt_steps=state.opt_steps + 1), metrics

  def update(self, state: IMPALAState, batch: Unroll, weights=None
             ) -> tuple[IMPALAState, dict, None]:
    """``k`` SGD steps, one per batch of unrolls (leaves ``[k, T + 1, N, ...]``), jitted,
    ``state`` donated; metrics averaged over the ``k`` steps; no feedback."""
    return self._jitted_update(state, batch)

  def _update(self, state: ActorCriticState, batch: Unroll):
    state, metrics = jax.lax.scan(self._sgd_step, state, batch)
    return state, jax.tree.map(jnp.mean, metrics), None
