"""DQN's loss objects (jaxasync.agents.dqn_losses) on tiny hand-computed batches, and the
command line's loss and target-update subcommands (parsed only)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tyro

import jaxasync as ja
from jaxasync import (Categorical, ConfigError, HardCopy, Munchausen, Polyak, QLearning,
                      Transition)
from jaxasync import experiment
from jaxasync.agents.dqn_losses import QOutputs, value_bound
from jaxasync.train import dqn as train_dqn
from jaxasync.train import rainbow as train_rainbow

# Two transitions, two actions. Online at obs [[1, 2], [3, 0]]; at next_obs (the double-Q
# selector) [[0, 1], [2, 1]]; target at next_obs [[4, 3], [1, 5]].
BATCH = Transition(obs=np.zeros((2, 1), np.float32), action=np.array([1, 0]),
                   reward=np.array([1.0, -1.0], np.float32),
                   discount=np.array([0.5, 0.9], np.float32), next_obs=np.zeros((2, 1), np.float32))
ONLINE_TM1 = np.array([[1.0, 2.0], [3.0, 0.0]], np.float32)
ONLINE_T = np.array([[0.0, 1.0], [2.0, 1.0]], np.float32)
TARGET_T = np.array([[4.0, 3.0], [1.0, 5.0]], np.float32)


def test_double_q_learning_by_hand():
  terms = QLearning()(QOutputs(ONLINE_TM1, ONLINE_T, TARGET_T), BATCH)
  # The online network selects [1, 0]; the target values them 3 and 1:
  # y = [1 + .5 * 3, -1 + .9 * 1] = [2.5, -.1]; Q(s, a) = [2, 3]; td = [.5, -3.1];
  # Huber (delta 1): [.125, 2.6].
  np.testing.assert_allclose(terms.per_item, [0.125, 2.6], rtol=1e-6)
  np.testing.assert_allclose(terms.priority, [0.5, 3.1], rtol=1e-6)
  np.testing.assert_allclose(terms.q_mean, 1.5, rtol=1e-6)
  # delta 2: |td| 3.1 is past it: 2 * (3.1 - 1) = 4.2.
  terms = QLearning(huber_delta=2.0)(QOutputs(ONLINE_TM1, ONLINE_T, TARGET_T), BATCH)
  np.testing.assert_allclose(terms.per_item, [0.125, 4.2], rtol=1e-6)


def test_plain_q_learning_by_hand():
  # Without double Q the agent gives the target's own outputs as the selector: its maximum.
  terms = QLearning(double_q=False)(QOutputs(ONLINE_TM1, TARGET_T, TARGET_T), BATCH)
  # y = [1 + .5 * 4, -1 + .9 * 5] = [3, 3.5]; td = [1, .5]; Huber: [.5, .125].
  np.testing.assert_allclose(terms.per_item, [0.5, 0.125], rtol=1e-6)
  np.testing.assert_allclose(terms.priority, [1.0, 0.5], rtol=1e-6)


def test_maxmin_q_learning_by_hand():
  # A second network, everywhere 1 below the first: the minimum is the second one.
  pair = lambda x: np.stack([x, x - 1.0])
  terms = QLearning(num_q_networks=2)(
      QOutputs(pair(ONLINE_TM1), pair(ONLINE_T), pair(TARGET_T)), BATCH)
  # Selection as above ([1, 0]); values of the minimum: 2 and 0: y = [2, -1].
  # Network 1: Q(s, a) = [2, 3], td = [0, -4]; network 2: [1, 2], td = [1, -3].
  # Per item, the Huber losses summed: [0 + .5, 3.5 + 2.5]; priority: mean |td| [.5, 3.5].
  np.testing.assert_allclose(terms.per_item, [0.5, 6.0], rtol=1e-6)
  np.testing.assert_allclose(terms.priority, [0.5, 3.5], rtol=1e-6)
  np.testing.assert_allclose(terms.q_mean, 0.5, rtol=1e-6)  # mean of ONLINE_TM1 - 1


def test_munchausen_by_hand():
  # One transition, temperature 1: the target's log pi at obs = log softmax([1, 0]) =
  # [-.313262, -1.313262]; its soft value at next_obs = logsumexp([2, 0]) = 2.126928.
  batch = Transition(obs=np.zeros((1, 1)), action=np.array([0]), reward=np.array([0.5]),
                     discount=np.array([0.9]), next_obs=np.zeros((1, 1)))
  q_t, q_tm1 = np.array([[2.0, 0.0]]), np.array([[1.0, 0.0]])
  loss = Munchausen(double_q=False, temperature=1.0, alpha=0.9, clip=-1.0)
  assert loss.needs_target_at_obs
  terms = loss(QOutputs(online_tm1=np.array([[1.0, 5.0]]), selector_t=q_t, target_t=q_t,
                        target_tm1=q_tm1), batch)
  y = 0.5 + 0.9 * -0.313262 + 0.9 * 2.126928
  np.testing.assert_allclose(terms.priority, [y - 1.0], rtol=1e-5)
  np.testing.assert_allclose(terms.per_item, [y - 1.0 - 0.5], rtol=1e-5)  # Huber, |td| > 1


def test_value_bound_by_hand():
  # Items: a 5-step CartPole segment (reward sum_{k<5} .99^k, discount .99^5: the value of
  # 1 per step forever, 100), a terminal one (discount 0: its reward), an undiscounted one.
  r5, d5 = sum(0.99 ** k for k in range(5)), 0.99 ** 5
  reward = np.array([r5, 1.0, 2.0], np.float32)
  discount = np.array([d5, 0.0, 1.0], np.float32)
  np.testing.assert_allclose(value_bound(reward, discount),
                             [100.0, 1.0, np.finfo(np.float32).max], rtol=1e-4)
  # A soft value adds at most tau * log(A) per bootstrap: (r5 + d5 * .03 log 2) / (1 - d5).
  bonus = 0.03 * np.log(2.0)
  np.testing.assert_allclose(value_bound(reward, discount, bonus)[:2],
                             [100.0 + d5 * bonus / (1 - d5), 1.0], rtol=1e-4)
  # Negative rewards: -1 / (1 - .5) = -2 and a terminal -1, both floored at 0, an ended
  # episode's value.
  np.testing.assert_allclose(value_bound(np.array([-1.0, -1.0], np.float32),
                                         np.array([0.5, 0.0], np.float32)), [0.0, 0.0])
  assert Munchausen(temperature=0.03).bonus_per_bootstrap(2) == pytest.approx(bonus)
  assert QLearning().bonus_per_bootstrap(2) == 0.0
  assert QLearning().segment_bound(BATCH, 2) is None  # bound_targets is off by default
  assert Categorical().segment_bound(BATCH, 2) is None


def test_targets_above_the_value_bound_are_clipped_to_it():
  # Double Q as in test_double_q_learning_by_hand: y = [2.5, -.1], Q(s, a) = [2, 3].
  # Clipped at 1: y = [1, -.1]; td = [-1, -3.1]; Huber: [.5, 2.6]; half the targets clipped.
  terms = QLearning()(QOutputs(ONLINE_TM1, ONLINE_T, TARGET_T), BATCH, np.float32(1.0))
  np.testing.assert_allclose(terms.per_item, [0.5, 2.6], rtol=1e-6)
  np.testing.assert_allclose(terms.priority, [1.0, 3.1], rtol=1e-6)
  np.testing.assert_allclose(terms.target_clipped, 0.5)
  unclipped = QLearning()(QOutputs(ONLINE_TM1, ONLINE_T, TARGET_T), BATCH)
  np.testing.assert_allclose(unclipped.per_item, [0.125, 2.6], rtol=1e-6)
  assert unclipped.target_clipped is None


def _tiny_agent(loss):
  import gymnasium as gym
  return ja.DQN(ja.DQNConfig(hidden_sizes=(8,), batch_size=2, loss=loss),
                gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Discrete(2))


def _stacked(reward, discount):
  """One update call's batch ``[k=1, B=2]`` of zero observations, action 0."""
  return Transition(obs=np.zeros((1, 2, 3), np.float32), action=np.zeros((1, 2), np.int32),
                    reward=np.array([reward], np.float32),
                    discount=np.array([discount], np.float32),
                    next_obs=np.zeros((1, 2, 3), np.float32))


@pytest.mark.parametrize("loss", [QLearning(bound_targets=True),
                                  Munchausen(bound_targets=True),
                                  QLearning(num_q_networks=2, bound_targets=True)])
def test_the_agent_keeps_the_running_maximum_of_the_sampled_bounds(loss):
  agent = _tiny_agent(loss)
  state = agent.init(jax.random.PRNGKey(0))
  assert float(state.value_bound) == 0.0
  bonus = loss.bonus_per_bootstrap(2)  # 0 for Q-learning, .03 log 2 for Munchausen
  state, metrics, _ = agent.update(state, _stacked([1.0, 0.5], [0.5, 0.0]))
  np.testing.assert_allclose(state.value_bound, (1.0 + 0.5 * bonus) / 0.5, rtol=1e-5)
  assert "target_clipped" in metrics
  state, _, _ = agent.update(state, _stacked([0.2, 0.1], [0.0, 0.0]))  # smaller: kept
  np.testing.assert_allclose(state.value_bound, (1.0 + 0.5 * bonus) / 0.5, rtol=1e-5)
  state, _, _ = agent.update(state, _stacked([3.0, 0.0], [0.0, 0.0]))  # larger: taken
  np.testing.assert_allclose(state.value_bound, 3.0, rtol=1e-6)


def test_the_agent_regresses_on_the_clipped_targets():
  # Target params that value every state at 50: an item with reward 1 and discount .5 has
  # the target 1 + .5 * 50 = 26 but supports at most 1 / (1 - .5) = 2; terminal items with
  # reward 0 have the target 0. With the bound, the first is regressed on 2: its TD error
  # (the priority) is 2 - Q(s, a).
  agent = _tiny_agent(QLearning(bound_targets=True))
  state = agent.init(jax.random.PRNGKey(0))
  head = state.target_params["params"]["Dense_0"]  # the Q head
  target_params = {"params": {**state.target_params["params"],
                              "Dense_0": {"kernel": jnp.zeros_like(head["kernel"]),
                                          "bias": jnp.full_like(head["bias"], 50.0)}}}
  state = state.replace(target_params=target_params)
  q_sa = float(agent.q_values(state.params, np.zeros((1, 3), np.float32))[0, 0])
  batch = _stacked([1.0, 0.0], [0.5, 0.0])
  _, metrics, priority = agent.update(jax.tree.map(jnp.copy, state), batch)  # (donated)
  np.testing.assert_allclose(priority[0], [abs(2.0 - q_sa), abs(0.0 - q_sa)], rtol=1e-4)
  np.testing.assert_allclose(metrics["target_clipped"], 0.5)
  unbounded = _tiny_agent(QLearning())
  _, metrics, priority = unbounded.update(state, batch)
  np.testing.assert_allclose(priority[0], [abs(26.0 - q_sa), abs(0.0 - q_sa)], rtol=1e-4)
  assert "target_clipped" not in metrics


def test_the_bound_is_never_below_zero_so_negative_rewards_keep_their_optimism():
  # Acrobot's case: -1 per step, no termination sampled yet. The segments support
  # -1 / (1 - .5) = -2, but an episode that ends is worth 0, so the bound stays 0 and the
  # target -1 + .5 * 0 (target params valuing every state at 0) is not clipped to -2.
  agent = _tiny_agent(QLearning(bound_targets=True))
  state = agent.init(jax.random.PRNGKey(0))
  head = state.target_params["params"]["Dense_0"]
  zero_head = {"kernel": jnp.zeros_like(head["kernel"]), "bias": jnp.zeros_like(head["bias"])}
  state = state.replace(target_params={"params": {**state.target_params["params"],
                                                  "Dense_0": zero_head}})
  q_sa = float(agent.q_values(state.params, np.zeros((1, 3), np.float32))[0, 0])
  new, metrics, priority = agent.update(jax.tree.map(jnp.copy, state),
                                        _stacked([-1.0, -1.0], [0.5, 0.5]))
  assert float(new.value_bound) == 0.0
  np.testing.assert_allclose(metrics["target_clipped"], 0.0)
  np.testing.assert_allclose(priority[0], [abs(-1.0 - q_sa)] * 2, rtol=1e-4)
  # A state restored from before the floor (a bound of -2) is floored at the next update.
  new, metrics, _ = agent.update(state.replace(value_bound=jnp.float32(-2.0)),
                                 _stacked([-1.0, -1.0], [0.5, 0.5]))
  assert float(new.value_bound) == 0.0 and float(metrics["target_clipped"]) == 0.0


def test_without_a_bound_the_state_keeps_its_initial_value():
  for loss in (QLearning(), Categorical(v_min=-5.0, v_max=5.0)):
    agent = _tiny_agent(loss)
    state, metrics, _ = agent.update(agent.init(jax.random.PRNGKey(0)),
                                     _stacked([1.0, 0.5], [0.5, 0.0]))
    assert float(state.value_bound) == 0.0
    assert "target_clipped" not in metrics


def test_categorical_by_hand():
  # Support [-1, 0, 1]. Item 0: the target puts all mass on z = 1 (both actions); r + .5 z =
  # 1 lands on the top atom; the online distribution at the action is uniform: cross-entropy
  # log 3. Item 1 is terminal: a point mass at r = -1, the bottom atom, where the online
  # distribution has .5: log 2.
  loss = Categorical(num_atoms=3, v_min=-1.0, v_max=1.0)
  np.testing.assert_allclose(loss.support(), [-1.0, 0.0, 1.0])
  batch = BATCH._replace(action=np.array([1, 0]), reward=np.array([0.5, -1.0], np.float32),
                         discount=np.array([0.5, 0.0], np.float32))
  peaked = np.broadcast_to(np.array([0.0, 0.0, 100.0], np.float32), (2, 2, 3))
  online_tm1 = np.zeros((2, 2, 3), np.float32)
  online_tm1[1, 0] = np.log([0.5, 0.25, 0.25])
  support = loss.support()
  terms = loss(QOutputs(online_tm1, peaked, peaked, support=support), batch)
  assert terms.per_item.shape == terms.priority.shape == (2,) and terms.q_mean.shape == ()
  np.testing.assert_allclose(terms.per_item, [np.log(3.0), np.log(2.0)], rtol=1e-5)
  np.testing.assert_allclose(terms.priority, terms.per_item)
  # Expected Q-values: 0 for the uniform distributions, -.5 + .25 = -.25 for the other.
  np.testing.assert_allclose(loss.expected_q(online_tm1, support), [[0.0, 0.0], [-0.25, 0.0]],
                             atol=1e-6)
  np.testing.assert_allclose(terms.q_mean, -0.0625, atol=1e-6)


def test_the_head_is_what_the_loss_needs():
  assert (QLearning().num_atoms, QLearning(num_q_networks=3).num_q_networks) == (1, 3)
  assert (Categorical(num_atoms=7).num_atoms, Categorical().num_q_networks) == (7, 1)
  assert not QLearning().needs_target_at_obs and not Categorical().needs_target_at_obs
  assert QLearning().support() is None and Categorical(num_atoms=7).support().shape == (7,)
  with pytest.raises(ConfigError, match="num_atoms >= 2"):
    Categorical(num_atoms=1).validate()


def test_shapes_are_checked_on_entry():
  with pytest.raises(AssertionError):  # an ensemble's outputs given to a one-network loss
    QLearning()(QOutputs(ONLINE_TM1[None], ONLINE_T[None], TARGET_T[None]), BATCH)
  with pytest.raises(AssertionError):  # expected Q-values given to the categorical loss
    Categorical()(QOutputs(ONLINE_TM1, ONLINE_T, TARGET_T, support=Categorical().support()),
                  BATCH)


# --- the command line ---------------------------------------------------------------------
def test_dqn_loss_subcommands_parse():
  assert tyro.cli(train_dqn.Args, args=[]).agent == train_dqn.cartpole_agent()
  args = tyro.cli(train_dqn.Args, args=["--seed", "3", "agent.loss:q-learning",
                                        "--agent.loss.num-q-networks", "2",
                                        "--agent.loss.no-double-q"])
  assert args.run.seed == 3
  assert args.agent.loss == QLearning(double_q=False, num_q_networks=2)
  args = tyro.cli(train_dqn.Args, args=["--agent.n-step", "3", "agent.loss:munchausen",
                                        "--agent.loss.alpha", "0.5"])
  # (the preset's own loss, so its other settings stay: the bound is on)
  assert args.agent.loss == Munchausen(alpha=0.5, bound_targets=True)
  assert args.agent.data.n_step == 3
  args = tyro.cli(train_dqn.Args, args=["agent.loss:categorical", "--agent.loss.v-min", "0",
                                        "--agent.loss.v-max", "100"])
  assert args.agent.loss == Categorical(v_min=0.0, v_max=100.0)
  # The run's and the agent's flags come before the subcommand.
  with pytest.raises(SystemExit):
    tyro.cli(train_dqn.Args, args=["agent.loss:q-learning", "--seed", "3"])


def test_target_update_subcommands_parse():
  assert tyro.cli(train_dqn.Args, args=[]).agent.target_update == Polyak(tau=0.005)
  # Both subcommands, in either order, each followed by its own flags.
  for argv in (["agent.target-update:hard-copy", "--agent.target-update.period", "500",
                "agent.loss:q-learning", "--agent.loss.no-double-q"],
               ["agent.loss:q-learning", "--agent.loss.no-double-q",
                "agent.target-update:hard-copy", "--agent.target-update.period", "500"]):
    agent = tyro.cli(train_dqn.Args, args=argv).agent
    assert (agent.target_update, agent.loss) == (HardCopy(period=500), QLearning(double_q=False))
  assert train_rainbow.parse(["--preset", "atari"]).agent.target_update == HardCopy(period=2_000)
  assert train_rainbow.parse(["target-update:polyak", "--target-update.tau", "0.01"]
                             ).agent.target_update == Polyak(tau=0.01)


@pytest.mark.parametrize("loss_cls", [QLearning, Munchausen, Categorical])
def test_variant_names_are_the_subcommands(loss_cls):
  """experiment.variant_name (config.json's agent.loss, the resume check's wording) spells a
  loss as its subcommand does."""
  name = experiment.variant_name(loss_cls)
  assert type(tyro.cli(train_dqn.Args, args=[f"agent.loss:{name}"]).agent.loss) is loss_cls
  assert type(train_rainbow.parse([f"loss:{name}"]).agent.loss) is loss_cls


def test_rainbow_loss_subcommands_parse_over_the_preset():
  assert train_rainbow.parse([]).agent == train_rainbow.cartpole_preset().agent
  # Naming the preset's own loss keeps its values (the MinAtar support) but for the flags given.
  args = train_rainbow.parse(["--preset", "minatar", "--no-noisy", "loss:categorical",
                              "--loss.num-atoms", "21"])
  assert args.agent.loss == Categorical(num_atoms=21, v_min=-100.0, v_max=100.0)
  assert not args.agent.noisy and args.agent.hidden_sizes == (128,)
  args = train_rainbow.parse(["loss:munchausen", "--loss.num-q-networks", "2"])
  assert args.agent.loss == Munchausen(num_q_networks=2)
  assert train_rainbow.components(args).endswith("noisy, Munchausen, Maxmin(2)")


def test_rainbow_is_a_named_preset_of_the_library():
  config = ja.rainbow_config(v_min=0.0, v_max=100.0, hidden_sizes=(64, 64))
  assert config.loss == Categorical(double_q=True, num_atoms=51, v_min=0.0, v_max=100.0)
  assert config.dueling and config.noisy and config.target_update == HardCopy(period=250)
  assert config.data.prioritized and config.data.n_step == 3
  assert ja.rainbow_replay(n_step=1).n_step == 1  # its parts can be overridden
