"""Tests for the DQN agent: losses against hand computations, updates, acting, validation."""

import chex
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

from jaxasync import (Categorical, ConfigError, DQN, DQNConfig, HardCopy, Munchausen, Polyak,
                      QLearning, Transition, linear_epsilon)
from jaxasync.agents.dqn import learning_rate_schedule
from jaxasync.agents.dqn_losses import munchausen_target

from helpers import BOX4, host as _host, random_batch as _random_batch


def _agent(num_actions=2, **config):
  config.setdefault("hidden_sizes", (4,))
  return DQN(DQNConfig(**config), BOX4, gym.spaces.Discrete(num_actions))


def _params(head_kernel):
  """Torso = identity + ReLU, linear head without bias: Q(o) = relu(o) @ head_kernel."""
  return {"params": {
      "MLPTorso_0": {"Dense_0": {"kernel": jnp.eye(4), "bias": jnp.zeros(4)}},
      "Dense_0": {"kernel": jnp.asarray(head_kernel, jnp.float32), "bias": jnp.zeros(2)},
  }}


# --- the expected-Q loss -----------------------------------------------------
# Online: Q(o) = [relu(o0), relu(o1)]; target: Q(o) = [relu(o1), relu(o0)] (swapped), so
# double DQN (select online, evaluate target) and plain max-target DQN differ.
ONLINE = _params([[1, 0], [0, 1], [0, 0], [0, 0]])
TARGET = _params([[0, 1], [1, 0], [0, 0], [0, 0]])
HAND_BATCH = Transition(
    obs=np.array([[1, 2, 0, 0], [0, 4, 0, 0], [2, 1, 0, 0]], np.float32),
    action=np.array([0, 1, 0], np.int64),
    reward=np.array([1.0, -1.0, 0.5], np.float32),
    discount=np.array([0.5, 0.9, 0.0], np.float32),
    next_obs=np.array([[3, 1, 0, 0], [0, 2, 0, 0], [5, 5, 0, 0]], np.float32),
)
HAND_WEIGHTS = np.array([1.0, 0.5, 2.0], np.float32)


def test_double_dqn_loss_by_hand():
  agent = _agent()
  loss, (priority, metrics) = agent.loss(ONLINE, TARGET, HAND_BATCH, HAND_WEIGHTS)
  # item 0: q(s,a)=1; online next [3,1] -> a*=0; target next [1,3] -> 1; y = 1 + .5*1 = 1.5
  #         td = .5, huber = .5*.5^2 = .125
  # item 1: q(s,a)=4; online next [0,2] -> a*=1; target next [2,0] -> 0; y = -1
  #         td = -5, huber = 5 - .5 = 4.5
  # item 2: q(s,a)=2; terminal: y = .5; td = -1.5, huber = 1.5 - .5 = 1
  # loss = (1*.125 + .5*4.5 + 2*1) / 3
  np.testing.assert_allclose(loss, 4.375 / 3, rtol=1e-6)
  np.testing.assert_allclose(priority, [0.5, 5.0, 1.5], rtol=1e-6)
  np.testing.assert_allclose(metrics["loss"], 4.375 / 3, rtol=1e-6)
  np.testing.assert_allclose(metrics["q_mean"], 10 / 6, rtol=1e-6)  # mean of [1,2],[0,4],[2,1]


def test_plain_dqn_loss_uses_max_of_target_by_hand():
  agent = _agent(loss=QLearning(double_q=False))
  loss, (priority, _) = agent.loss(ONLINE, TARGET, HAND_BATCH, HAND_WEIGHTS)
  # item 0: y = 1 + .5 * max[1,3] = 2.5, td = 1.5, huber = 1
  # item 1: y = -1 + .9 * max[2,0] = .8, td = -3.2, huber = 2.7
  # item 2: terminal, td = -1.5, huber = 1
  np.testing.assert_allclose(loss, (1.0 + 0.5 * 2.7 + 2 * 1.0) / 3, rtol=1e-6)
  np.testing.assert_allclose(priority, [1.5, 3.2, 1.5], rtol=1e-6)


def _huber(x, delta=1.0):
  a = np.abs(x)
  return np.where(a <= delta, 0.5 * x ** 2, delta * (a - 0.5 * delta))


@pytest.mark.parametrize("double_q", [True, False])
def test_loss_matches_numpy_on_random_params(double_q):
  agent = _agent(loss=QLearning(double_q=double_q), hidden_sizes=(8,))
  params = agent.init(jax.random.PRNGKey(0)).params
  target_params = agent.init(jax.random.PRNGKey(1)).params
  rng = np.random.default_rng(0)
  batch = _random_batch(rng, (16,))
  weights = rng.uniform(0.1, 2.0, size=16).astype(np.float32)
  apply = lambda p, o: np.asarray(agent.network.apply(p, o), np.float64)
  q_tm1, q_target = apply(params, batch.obs), apply(target_params, batch.next_obs)
  if double_q:
    a_star = np.argmax(apply(params, batch.next_obs), axis=1)
  else:
    a_star = np.argmax(q_target, axis=1)
  y = batch.reward + batch.discount * q_target[np.arange(16), a_star]
  td = y - q_tm1[np.arange(16), batch.action]
  loss_fn = jax.jit(agent.loss)
  loss, (priority, _) = loss_fn(params, target_params, batch, weights)
  np.testing.assert_allclose(loss, np.mean(weights * _huber(td)), rtol=1e-5)
  np.testing.assert_allclose(priority, np.abs(td), rtol=1e-5, atol=1e-6)
  # Weights matter: unit weights give a different value.
  unit, _ = loss_fn(params, target_params, batch, np.ones(16, np.float32))
  np.testing.assert_allclose(unit, np.mean(_huber(td)), rtol=1e-5)
  assert abs(float(unit) - float(loss)) > 1e-4


# --- Maxmin ensemble (QLearning(num_q_networks > 1)) ----------------------------------------
def _stacked(*head_kernels):
  """N networks as one params tree with a leading axis of N (what nn.vmap builds)."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *(_params(k) for k in head_kernels))


# Online networks: Q_A(o) = [o0, o1], Q_B(o) = [.5 o0, 3 o1]; min: [.5 o0, min(o1, 3 o1)].
# Target networks: Q_C(o) = [o1, o0], Q_D(o) = [2 o0, .5 o1].
ONLINE_PAIR = _stacked([[1, 0], [0, 1], [0, 0], [0, 0]], [[0.5, 0], [0, 3], [0, 0], [0, 0]])
TARGET_PAIR = _stacked([[0, 1], [1, 0], [0, 0], [0, 0]], [[2, 0], [0, 0.5], [0, 0], [0, 0]])


def test_maxmin_loss_by_hand():
  agent = _agent(loss=QLearning(num_q_networks=2))
  loss, (priority, metrics) = agent.loss(ONLINE_PAIR, TARGET_PAIR, HAND_BATCH, HAND_WEIGHTS)
  # item 0: next [3,1]: online min [1.5, 1] -> a*=0; target min at 0: min(1, 6) = 1;
  #         y = 1 + .5*1 = 1.5; Q_A(s,0) = 1 -> td .5 (huber .125); Q_B(s,0) = .5 -> td 1 (.5)
  # item 1: next [0,2]: online min [0, 2] -> a*=1; target min at 1: min(0, 1) = 0; y = -1;
  #         Q_A(s,1) = 4 -> td -5 (4.5); Q_B(s,1) = 12 -> td -13 (12.5)
  # item 2: terminal, y = .5; Q_A(s,0) = 2 -> td -1.5 (1); Q_B(s,0) = 1 -> td -.5 (.125)
  # per item: the networks' Huber losses summed: [.625, 17, 1.125]; weighted mean over 3.
  np.testing.assert_allclose(loss, (0.625 + 0.5 * 17 + 2 * 1.125) / 3, rtol=1e-6)
  np.testing.assert_allclose(priority, [0.75, 9.0, 1.0], rtol=1e-6)  # mean |td| over networks
  # q_mean: of the minimum over networks at obs: [.5,2], [0,4], [1,1]
  np.testing.assert_allclose(metrics["q_mean"], 8.5 / 6, rtol=1e-6)


def test_maxmin_acts_on_the_minimum():
  agent = _agent(loss=QLearning(num_q_networks=2))
  obs = np.array([[1.0, 0.8, 0, 0], [4.0, 1.0, 0, 0]], np.float32)
  # Q_A = [1, .8] (argmax 0), Q_B = [.5, 2.4]: the minimum [.5, .8] picks 1;
  # Q_A = [4, 1], Q_B = [2, 3]: the minimum [2, 1] picks 0.
  np.testing.assert_allclose(agent.q_values(ONLINE_PAIR, obs), [[0.5, 0.8], [2.0, 1.0]])
  np.testing.assert_array_equal(agent.policy(ONLINE_PAIR, obs, np.random.default_rng(0)), [1, 0])


def test_maxmin_networks_are_independent_and_update():
  agent = _agent(loss=QLearning(num_q_networks=3), hidden_sizes=(8,))
  state = agent.init(jax.random.PRNGKey(0))
  kernel = state.params["params"]["Dense_0"]["kernel"]
  chex.assert_shape(kernel, (3, 8, 2))
  assert not np.allclose(kernel[0], kernel[1])  # independently initialised
  batch = _random_batch(np.random.default_rng(0), (2, 16))
  before = jax.tree.map(np.array, state.params)
  state, metrics, priority = agent.update(state, batch)
  chex.assert_shape(priority, (2, 16))
  moved = jax.tree.map(lambda a, b: np.abs(np.asarray(a) - b).reshape(3, -1).max(1),
                       state.params, before)
  assert all((m > 0).all() for m in jax.tree.leaves(moved))  # every network learns
  assert np.isfinite(float(metrics["loss"]))


# --- Munchausen DQN -----------------------------------------------------------
def test_munchausen_target_by_hand():
  # tau 1: log pi(. | s_tm1) = log softmax([1, 0]) = [-.313262, -1.313262];
  # soft value at s_t = logsumexp([2, 0]) = 2.126928.
  q_tm1, q_t = jnp.array([1.0, 0.0]), jnp.array([2.0, 0.0])
  target = lambda a, d: float(munchausen_target(q_tm1, a, 0.5, d, q_t, 1.0, 0.9, -1.0))
  np.testing.assert_allclose(target(1, 0.9), 0.5 + 0.9 * -1.0 + 0.9 * 2.126928, rtol=1e-5)  # clipped
  np.testing.assert_allclose(target(0, 0.9), 0.5 + 0.9 * -0.313262 + 0.9 * 2.126928, rtol=1e-5)
  np.testing.assert_allclose(target(0, 0.0), 0.5 + 0.9 * -0.313262, rtol=1e-5)  # terminal
  # alpha 0 and a cold softmax: the plain max-Q target.
  cold = munchausen_target(q_tm1, 1, 0.5, 0.9, q_t, 1e-4, 0.0, -1.0)
  np.testing.assert_allclose(cold, 0.5 + 0.9 * 2.0, rtol=1e-5)
  # Double Q: a selector preferring action 1 ([0, 2] at tau 1: pi = [.119203, .880797]) weights
  # the target's values [2, 0]: sum pi (q - log pi) = .119203 * (2 + 2.126928)
  # + .880797 * (0 + .126928) = .603740.
  double = munchausen_target(q_tm1, 0, 0.5, 0.9, q_t, 1.0, 0.9, -1.0, jnp.array([0.0, 2.0]))
  np.testing.assert_allclose(double, 0.5 + 0.9 * -0.313262 + 0.9 * 0.603740, rtol=1e-5)
  # A cold selector picks its argmax, which the target values: the double-Q target.
  cold = munchausen_target(q_tm1, 1, 0.5, 0.9, q_t, 1e-4, 0.0, -1.0, jnp.array([0.0, 2.0]))
  np.testing.assert_allclose(cold, 0.5 + 0.9 * 0.0, atol=1e-5)


@pytest.mark.parametrize("num_q_networks,double_q", [(1, True), (2, True), (1, False)])
def test_munchausen_loss_matches_numpy_on_random_params(num_q_networks, double_q):
  tau, alpha = 0.5, 0.9
  agent = _agent(loss=Munchausen(temperature=tau, alpha=alpha, num_q_networks=num_q_networks,
                                 double_q=double_q), hidden_sizes=(8,))
  params = agent.init(jax.random.PRNGKey(0)).params
  target_params = agent.init(jax.random.PRNGKey(1)).params
  batch = _random_batch(np.random.default_rng(0), (16,))
  weights = np.ones(16, np.float32)
  def q(p, o):  # [N, B, A], and its minimum over networks
    out = np.asarray(agent.network.apply(p, o), np.float64).reshape(num_q_networks, 16, 2)
    return out, out.min(0)
  def log_softmax(x):
    x = x / tau
    return x - x.max(1, keepdims=True) - np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True))
  _, qbar_tm1 = q(target_params, batch.obs)
  _, qbar_t = q(target_params, batch.next_obs)
  i = np.arange(16)
  bonus = alpha * np.clip(tau * log_softmax(qbar_tm1)[i, batch.action], -1.0, 0.0)
  # Double Q: the online networks' (minimum's) soft policy weights the target's values.
  log_pi_t = log_softmax(q(params, batch.next_obs)[1] if double_q else qbar_t)
  soft_v = (np.exp(log_pi_t) * (qbar_t - tau * log_pi_t)).sum(1)
  y = batch.reward + bonus + batch.discount * soft_v
  q_tm1, _ = q(params, batch.obs)
  td = y[None] - q_tm1[:, i, batch.action]  # [N, B]
  loss, (priority, _) = jax.jit(agent.loss)(params, target_params, batch, weights)
  np.testing.assert_allclose(loss, np.mean(_huber(td).sum(0)), rtol=1e-5)
  np.testing.assert_allclose(priority, np.abs(td).mean(0), rtol=1e-5, atol=1e-6)
  assert (bonus < -1e-3).any()  # the bonus took part


def test_maxmin_double_q_matches_numpy_on_random_params():
  """The ensemble's double-Q target on random params: the minimum of the online networks
  selects the bootstrap action, the minimum of the target networks values it. (The hand test
  above cannot tell this rule from selecting with one network; this one can, and checks it.)"""
  agent = _agent(loss=QLearning(num_q_networks=3), hidden_sizes=(8,))
  params = agent.init(jax.random.PRNGKey(0)).params
  target_params = agent.init(jax.random.PRNGKey(1)).params
  batch = _random_batch(np.random.default_rng(0), (64,))
  weights = np.ones(64, np.float32)
  def q(p, o):  # [N, B, A]
    return np.asarray(agent.network.apply(p, o), np.float64).reshape(3, 64, 2)
  i = np.arange(64)
  online_t, target_t, q_tm1 = q(params, batch.next_obs), q(target_params, batch.next_obs), q(
      params, batch.obs)
  def td_for(a_t, value_t):
    y = batch.reward + batch.discount * value_t[i, a_t]
    return y[None] - q_tm1[:, i, batch.action]
  td = td_for(online_t.min(0).argmax(1), target_t.min(0))
  loss, (priority, _) = jax.jit(agent.loss)(params, target_params, batch, weights)
  np.testing.assert_allclose(loss, np.mean(_huber(td).sum(0)), rtol=1e-5)
  np.testing.assert_allclose(priority, np.abs(td).mean(0), rtol=1e-5, atol=1e-6)
  # The alternatives give other losses on this batch, so the check above can fail.
  for a_t, value_t in [(online_t[0].argmax(1), target_t.min(0)),
                       (online_t.max(0).argmax(1), target_t.min(0)),
                       (online_t.min(0).argmax(1), target_t[0])]:
    assert abs(np.mean(_huber(td_for(a_t, value_t)).sum(0)) - float(loss)) > 1e-4


# --- C51 -----------------------------------------------------------------------
SUPPORT = np.array([-1.0, -0.5, 0.0, 0.5, 1.0], np.float32)


def test_categorical_projection_by_hand():
  probs = np.array([0.1, 0.2, 0.3, 0.2, 0.2], np.float32)
  # r = .25, discount = .5: atoms move to [-.25, 0, .25, .5, .75].
  #   -.25 (.1) splits halfway between -.5 and 0; 0 (.2) -> 0; .25 (.3) splits between 0 and .5;
  #   .5 (.2) -> .5; .75 (.2) splits between .5 and 1.
  projected = rlax.categorical_l2_project(0.25 + 0.5 * SUPPORT, probs, SUPPORT)
  np.testing.assert_allclose(projected, [0.0, 0.05, 0.4, 0.45, 0.1], atol=1e-6)
  # r = 1, discount = 1: atoms move to [0, .5, 1, 1.5, 2]; everything above 1 is clipped to 1.
  projected = rlax.categorical_l2_project(1.0 + SUPPORT, probs, SUPPORT)
  np.testing.assert_allclose(projected, [0.0, 0.0, 0.1, 0.2, 0.7], atol=1e-6)
  # Terminal (discount 0): a point mass at r = .25 splits between 0 and .5.
  projected = rlax.categorical_l2_project(0.25 + 0.0 * SUPPORT, probs, SUPPORT)
  np.testing.assert_allclose(projected, [0.0, 0.0, 0.5, 0.5, 0.0], atol=1e-6)


def _np_project(z, probs, support):
  """Independent C51 projection: each shifted atom splits its mass between its neighbours."""
  v_min, v_max = support[0], support[-1]
  dz = support[1] - support[0]
  out = np.zeros(len(support))
  for zj, pj in zip(np.clip(z, v_min, v_max), probs):
    b = (zj - v_min) / dz
    lo, hi = int(np.floor(b + 1e-9)), int(np.ceil(b - 1e-9))
    if lo == hi:
      out[lo] += pj
    else:
      out[lo] += pj * (hi - b)
      out[hi] += pj * (b - lo)
  return out


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def test_c51_loss_matches_numpy():
  agent = _agent(loss=Categorical(num_atoms=5, v_min=-1.0, v_max=1.0), hidden_sizes=(8,))
  np.testing.assert_allclose(agent.support, SUPPORT)
  params = agent.init(jax.random.PRNGKey(0)).params
  target_params = agent.init(jax.random.PRNGKey(1)).params
  rng = np.random.default_rng(1)
  batch = _random_batch(rng, (6,))
  batch = batch.replace(reward=rng.choice([-0.5, 0.25, 1.0], size=6).astype(np.float32))
  weights = rng.uniform(0.5, 1.5, size=6).astype(np.float32)
  logits_tm1 = np.asarray(agent.network.apply(params, batch.obs), np.float64)
  logits_t = np.asarray(agent.network.apply(target_params, batch.next_obs), np.float64)
  online_t = np.asarray(agent.network.apply(params, batch.next_obs), np.float64)
  chex.assert_shape([logits_tm1, logits_t], (6, 2, 5))
  q_select = (_softmax(online_t) * SUPPORT).sum(-1)
  per_item = []
  for i in range(6):
    a_star = np.argmax(q_select[i])
    target = _np_project(batch.reward[i] + batch.discount[i] * SUPPORT,
                         _softmax(logits_t[i, a_star]), SUPPORT)
    log_p = np.log(_softmax(logits_tm1[i, batch.action[i]]))
    per_item.append(-np.sum(target * log_p))
  loss, (priority, metrics) = jax.jit(agent.loss)(params, target_params, batch, weights)
  np.testing.assert_allclose(priority, per_item, rtol=1e-5)
  np.testing.assert_allclose(loss, np.mean(weights * np.array(per_item)), rtol=1e-5)
  # Expected Q-values of the categorical head.
  np.testing.assert_allclose(agent.q_values(params, batch.obs),
                             (_softmax(logits_tm1) * SUPPORT).sum(-1), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(metrics["q_mean"], (_softmax(logits_tm1) * SUPPORT).sum(-1).mean(),
                             rtol=1e-5)


# --- updates -------------------------------------------------------------------
def test_update_compiles_once():
  agent = _agent()
  state = agent.init(jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  for _ in range(5):
    state, metrics, priority = agent.update(
        state, _random_batch(rng, (2, 8)), np.ones((2, 8), np.float32))
  assert agent._jitted_update._cache_size() == 1
  assert int(state.opt_steps) == 10


def test_update_traces_once_with_assert_max_traces():
  agent = _agent()
  update = jax.jit(chex.assert_max_traces(agent._update, n=1))
  state = agent.init(jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  for _ in range(5):
    state, _, _ = update(state, _random_batch(rng, (2, 8)), np.ones((2, 8), np.float32))
  assert int(state.opt_steps) == 10
  with pytest.raises(AssertionError):  # a different shape would retrace: the guard works
    update(state, _random_batch(rng, (2, 9)), np.ones((2, 9), np.float32))


def test_greedy_actions_compile_once():
  agent = _agent()
  params = agent.init(jax.random.PRNGKey(0)).params
  rng = np.random.default_rng(0)
  greedy = jax.jit(chex.assert_max_traces(agent._greedy_actions, n=1))
  for _ in range(5):
    obs = rng.normal(size=(8, 4)).astype(np.float32)
    agent.act(params, obs, agent.fixed_epsilon(0.1), rng)[0]
    np.testing.assert_array_equal(greedy(params, obs), agent.greedy_actions(params, obs))
  assert agent.greedy_actions._cache_size() == 1


def test_update_with_k_stacked_batches():
  agent = _agent(learning_rate=1e-2)
  state = agent.init(jax.random.PRNGKey(0))
  before = _host(state)
  batch = _random_batch(np.random.default_rng(0), (3, 8))
  new, metrics, priority = agent.update(state, batch, None)
  assert int(new.opt_steps) == 3
  chex.assert_shape(priority, (3, 8))
  assert set(metrics) == {"loss", "q_mean", "grad_norm", "action_gap", "q_max"}
  chex.assert_tree_shape_prefix(metrics, ())
  assert all(np.isfinite(float(v)) for v in metrics.values())
  changed = jax.tree.map(lambda a, b: not np.allclose(a, b), before.params, _host(new.params))
  assert all(jax.tree.leaves(changed))
  assert int(new.opt_state[1][0].count) == 3  # Adam stepped three times

  # Same as three single-step calls on the slices.
  state = agent.init(jax.random.PRNGKey(0))
  for i in range(3):
    state, _, p = agent.update(state, jax.tree.map(lambda x: x[i:i + 1], batch), None)
    np.testing.assert_allclose(p[0], priority[i], rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(_host(state), _host(new), rtol=1e-5, atol=1e-6)


def test_hard_target_copy_every_period():
  agent = _agent(target_update=HardCopy(period=2), learning_rate=1e-2)
  state = agent.init(jax.random.PRNGKey(0))
  p0 = _host(state.params)
  chex.assert_trees_all_equal(_host(state.target_params), p0)
  rng = np.random.default_rng(0)
  one = lambda s: agent.update(s, _random_batch(rng, (1, 8)), None)[0]

  state = one(state)  # step 1: no copy yet
  p1 = _host(state.params)
  assert int(state.opt_steps) == 1
  chex.assert_trees_all_equal(_host(state.target_params), p0)
  assert not np.allclose(p1["params"]["Dense_0"]["kernel"], p0["params"]["Dense_0"]["kernel"])

  state = one(state)  # step 2: hard copy
  p2 = _host(state.params)
  chex.assert_trees_all_equal(_host(state.target_params), p2)

  state = one(state)  # step 3: target stays at step 2's params
  chex.assert_trees_all_equal(_host(state.target_params), p2)
  assert not np.allclose(_host(state.params)["params"]["Dense_0"]["kernel"],
                         p2["params"]["Dense_0"]["kernel"])

  state = agent.update(state, _random_batch(rng, (3, 8)), None)[0]  # steps 4..6: copy at 6
  assert int(state.opt_steps) == 6
  chex.assert_trees_all_equal(_host(state.target_params), _host(state.params))


@pytest.mark.parametrize("tau", [0.5, 0.25])  # 0.25 tells new from old apart
def test_polyak_target_update(tau):
  agent = _agent(target_update=Polyak(tau=tau), learning_rate=1e-2)
  state = agent.init(jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  state = agent.update(state, _random_batch(rng, (1, 8)), None)[0]
  for _ in range(2):
    old_target = _host(state.target_params)
    state = agent.update(state, _random_batch(rng, (1, 8)), None)[0]
    new_params = _host(state.params)
    expected = jax.tree.map(lambda t, p: (1 - tau) * t + tau * p, old_target, new_params)
    if tau == 0.5:  # halves are exact in float32
      chex.assert_trees_all_equal(_host(state.target_params), expected)
    chex.assert_trees_all_close(_host(state.target_params), expected, rtol=1e-6, atol=1e-7)
    assert not np.allclose(new_params["params"]["Dense_0"]["kernel"],
                           old_target["params"]["Dense_0"]["kernel"])


# --- acting ----------------------------------------------------------------------
def test_act_greedy_equals_argmax_q():
  agent = _agent(num_actions=3)
  params = agent.init(jax.random.PRNGKey(3)).params
  obs = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32)
  actions = agent.act(params, obs, agent.fixed_epsilon(0.0), np.random.default_rng(0))[0]
  np.testing.assert_array_equal(actions, np.argmax(agent.q_values(params, obs), axis=-1))
  assert actions.dtype == np.int64 and actions.shape == (256,)
  assert len(np.unique(actions)) > 1  # a test on distinct greedy actions, not a constant


def _assert_uniform(actions, num_actions):
  counts = np.bincount(actions, minlength=num_actions)
  expected = len(actions) / num_actions
  chi2 = np.sum((counts - expected) ** 2 / expected)
  assert chi2 < 13.8, counts  # 99.9% quantile of chi-square with 2 degrees of freedom


def test_act_epsilon_one_is_uniform():
  agent = _agent(num_actions=3)
  params = agent.init(jax.random.PRNGKey(3)).params
  obs = np.zeros((6000, 4), np.float32)  # one greedy action for all rows
  greedy = np.asarray(agent.greedy_actions(params, obs))
  assert len(np.unique(greedy)) == 1
  _assert_uniform(agent.act(params, obs, agent.fixed_epsilon(1.0), np.random.default_rng(0))[0], 3)


def test_act_per_row_epsilon():
  agent = _agent(num_actions=3)
  params = agent.init(jax.random.PRNGKey(3)).params
  obs = np.zeros((6000, 4), np.float32)
  greedy = int(agent.greedy_actions(params, obs[:1])[0])
  epsilon = np.where(np.arange(6000) % 2 == 0, 0.0, 1.0)
  actions = agent.act(params, obs, agent.fixed_epsilon(epsilon), np.random.default_rng(0))[0]
  assert np.all(actions[0::2] == greedy)
  _assert_uniform(actions[1::2], 3)


def test_linear_epsilon_schedule():
  agent = _agent(eps_start=1.0, eps_end=0.1, eps_decay_steps=1000)
  assert agent.epsilon(0) == 1.0
  np.testing.assert_allclose(agent.epsilon(500), 0.55)
  assert agent.epsilon(1000) == pytest.approx(0.1)
  assert agent.epsilon(10_000) == pytest.approx(0.1)
  assert linear_epsilon(250, 1.0, 0.0, 1000) == 0.75


# --- validation --------------------------------------------------------------------
def test_learning_rate_anneals_linearly_then_holds():
  """Adam's step size goes from learning_rate to learning_rate_end over
  learning_rate_decay_steps SGD steps, counted inside the jitted k-step update."""
  agent = _agent(learning_rate=1e-2, learning_rate_end=1e-3, learning_rate_decay_steps=10)
  schedule = learning_rate_schedule(agent.config)
  np.testing.assert_allclose([schedule(t) for t in (0, 5, 10, 20)],
                             [1e-2, 5.5e-3, 1e-3, 1e-3], rtol=1e-6)
  assert learning_rate_schedule(DQNConfig(learning_rate=3e-4)) == 3e-4  # constant
  # The optimizer's own count advances with the SGD steps of a k-step call.
  state = agent.init(jax.random.PRNGKey(0))
  state = agent.update(state, _random_batch(np.random.default_rng(0), (4, 8)), None)[0]
  counts = [np.asarray(x) for x in jax.tree.leaves(state.opt_state)
            if np.ndim(x) == 0 and np.issubdtype(np.asarray(x).dtype, np.integer)]
  assert counts and all(int(c) == 4 for c in counts)


def test_continuous_action_space_is_rejected():
  with pytest.raises(ConfigError, match="need a Discrete action space") as e:
    DQN(DQNConfig(), BOX4, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), env_id="Pendulum-v1")
  assert "Pendulum-v1" in str(e.value) and "continuous-control algorithm" in str(e.value)


def test_discrete_observation_space_is_rejected():
  with pytest.raises(ConfigError, match="FlattenObservation"):
    DQN(DQNConfig(), gym.spaces.Discrete(5), gym.spaces.Discrete(2))


@pytest.mark.parametrize("config, message", [
    (dict(target_update=Polyak(tau=0.0)), "tau must be in"),
    (dict(batch_size=0), "batch_size must be >= 1"),
    (dict(target_update=HardCopy(period=0)), "period must be >= 1"),
    (dict(loss=Categorical(num_atoms=5, v_min=1.0, v_max=1.0)), "v_min < v_max"),
    (dict(eps_end=1.5), "eps_start and eps_end must be in"),
    (dict(learning_rate=-1e-3), "learning_rate must be a finite number > 0"),
    (dict(learning_rate_end=-1.0, learning_rate_decay_steps=10), "learning_rate_end >= 0"),
    (dict(loss=QLearning(num_q_networks=0)), "num_q_networks must be >= 1"),
    (dict(loss=QLearning(huber_delta=float("inf"))), "huber_delta must be a finite number > 0"),
    (dict(loss=QLearning(huber_delta=0.0)), "huber_delta must be a finite number > 0"),
    (dict(loss=Munchausen(temperature=0.0)), "need temperature > 0"),
])
def test_bad_config_is_rejected(config, message):
  with pytest.raises(ConfigError, match=message):
    _agent(**config)


@pytest.mark.parametrize("loss_cls, field", [(Categorical, "num_q_networks"),
                                             (Munchausen, "num_atoms"),
                                             (Categorical, "huber_delta")])
def test_combinations_without_a_meaning_cannot_be_written(loss_cls, field):
  """Maxmin over C51 distributions and a Munchausen bonus on C51, refused at run time while
  they were flags, are not fields of the loss they would combine with."""
  with pytest.raises(TypeError, match=field):
    loss_cls(**{field: 2})


def test_layer_norm_torso_matches_a_hand_computation():
  """--agent.layer-norm: each torso layer is Dense -> LayerNorm -> ReLU, so with an identity
  Dense, LayerNorm's default scale 1 / bias 0 and a linear head, Q(o) = relu(norm(o)) @ K."""
  agent = _agent(layer_norm=True)
  params = agent.network.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))
  assert set(params["params"]["MLPTorso_0"]) == {"Dense_0", "LayerNorm_0"}
  kernel = np.array([[1.0, -2.0], [0.5, 0.0], [0.0, 3.0], [-1.0, 1.0]], np.float32)
  params = {"params": {
      "MLPTorso_0": {"Dense_0": {"kernel": jnp.eye(4), "bias": jnp.zeros(4)},
                     "LayerNorm_0": params["params"]["MLPTorso_0"]["LayerNorm_0"]},
      "Dense_0": {"kernel": jnp.asarray(kernel), "bias": jnp.zeros(2)}}}
  obs = np.array([[1.0, 2.0, 3.0, 4.0], [10.0, -10.0, 0.0, 0.0]], np.float32)
  mean = obs.mean(axis=1, keepdims=True)
  normed = (obs - mean) / np.sqrt(obs.var(axis=1, keepdims=True) + 1e-6)
  expected = np.maximum(normed, 0.0) @ kernel
  np.testing.assert_allclose(agent.network.apply(params, obs), expected, rtol=1e-5, atol=1e-5)
  # Scaling an observation leaves its normalised features, and so its Q-values, unchanged.
  np.testing.assert_allclose(agent.network.apply(params, 100 * obs), expected, rtol=1e-4,
                             atol=1e-4)


@pytest.mark.parametrize("shape,dtype,torso,layers", [
    ((84, 84, 4), np.uint8, "NatureCNN_0", 4), ((10, 10, 3), np.bool_, "MinAtarCNN_0", 2)])
def test_layer_norm_in_a_cnn_torso_normalises_every_layer(shape, dtype, torso, layers):
  """CNN torsos take layer_norm too: a LayerNorm before each ReLU (per conv over its channels,
  then over the dense features), so each torso layer's pre-ReLU output has mean 0 and variance
  ~1 over its last axis at initialisation."""
  agent = DQN(DQNConfig(layer_norm=True), gym.spaces.Box(0, 1, shape, dtype),
              gym.spaces.Discrete(3))
  params = agent.init(jax.random.PRNGKey(0)).params
  assert sum(k.startswith("LayerNorm_") for k in params["params"][torso]) == layers
  high = 256 if dtype == np.uint8 else 2  # frames span 0-255, MinAtar channels 0/1
  obs = np.random.default_rng(0).integers(0, high, (5,) + shape).astype(dtype)
  _, inter = agent.network.apply(params, obs, capture_intermediates=True,
                                 mutable=["intermediates"])
  norms = [v["__call__"][0] for k, v in inter["intermediates"][torso].items()
           if k.startswith("LayerNorm_")]
  assert len(norms) == layers
  for out in norms:
    chex.assert_trees_all_close(jnp.mean(out, -1), jnp.zeros(out.shape[:-1]), atol=1e-4)
    chex.assert_trees_all_close(jnp.var(out, -1), jnp.ones(out.shape[:-1]), atol=1e-2)
