"""Learning health: the replay's terminal fraction and return bound, the Q agents' action gap
and q_max, the overestimation warning, the summary's ``health`` series and its plot, each
against a hand computation."""

from __future__ import annotations

import json
import logging
import types

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxasync as ja
from jaxasync import plot
from jaxasync.agents.dqn import greedy_q_metrics
from jaxasync.collectors.frames import FrameStepProcessor
from jaxasync.ledger import (OVERESTIMATION_RECORDS, RunLedger, over_bound,
                             overestimation_margin)
from jaxasync.recorder import NullRecorder
from jaxasync.replay import PrioritizedReplayBuffer, ReplayBuffer
from jaxasync.replay.frames import FrameReplayBuffer, PrioritizedFrameReplayBuffer
from jaxasync.sources.replay import (ReplaySource, return_bound, segment_values,
                                     terminal_fraction)
from helpers import BOX4, random_batch

GAMMA = 0.99


def _items(reward, discount) -> ja.Transition:
  """A chunk of transitions ``[N]`` with the given returns and discounts (obs do not matter)."""
  n = len(reward)
  obs = np.zeros((n, 4), np.float32)
  return ja.Transition(obs=obs, action=np.zeros(n, np.int64),
                       reward=np.asarray(reward, np.float32),
                       discount=np.asarray(discount, np.float32), next_obs=obs)


# --- the replay's figures ------------------------------------------------------------------------
def test_return_bound_and_terminal_fraction_by_hand():
  # CartPole's 3-step items: R = 1 + g + g^2, d = g^3: R / (1 - d) = 1 / (1 - g) = 100.
  r3, d3 = 1 + GAMMA + GAMMA ** 2, GAMMA ** 3
  assert return_bound(np.array([r3, 1.0]), np.array([d3, 0.0])) == pytest.approx(100.0)
  # A truncated one-step item (d = g) is worth the same; a terminal one only its return.
  assert return_bound(np.array([1.0, 7.0]), np.array([GAMMA, 0.0])) == pytest.approx(100.0)
  assert return_bound(np.array([-3.0, -1.0]), np.array([0.5, 0.5])) == pytest.approx(-2.0)
  # d = 1 (gamma = 1): a positive segment repeated undiscounted has no bound; zero is worth 0.
  assert return_bound(np.array([1.0, 2.0]), np.array([1.0, 0.0])) is None
  assert return_bound(np.array([0.0, -1.0]), np.array([1.0, 0.5])) == 0.0
  np.testing.assert_allclose(segment_values(np.array([2.0, 0.0, -1.0, -1.0]),
                                            np.array([0.5, 1.0, 1.0, 0.0])),
                             [4.0, 0.0, -np.inf, -1.0])
  # Only discount exactly 0 is terminal: a truncated item (d = g^m > 0) bootstraps.
  assert terminal_fraction(np.array([0.0, d3, GAMMA, 0.0, d3])) == pytest.approx(2 / 5)


@pytest.mark.parametrize("replay_cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_replay_source_metrics_over_the_filled_ring(replay_cls):
  replay = replay_cls(jax.tree.map(lambda x: x[0], _items([0.0], [0.0])), capacity=4)
  source = ReplaySource(replay, batch_size=1)
  assert source.metrics() == {}  # empty: nothing to say
  r3, d3 = 1 + GAMMA + GAMMA ** 2, GAMMA ** 3
  source.add(_items([50.0, r3, 1.0], [0.0, d3, 0.0]), version=0, env_steps=3)
  # Slots 0..2: 50 / 1 = 50, r3 / (1 - d3) = 100, 1 / 1 = 1; terminal 2 of 3.
  m = source.metrics()
  assert m["replay_terminal_fraction"] == pytest.approx(2 / 3)
  assert m["q_bound"] == pytest.approx(100.0, rel=1e-5) and m["q_floor"] == pytest.approx(1.0)
  # Three more wrap the ring: the first two are overwritten, 150 (terminal) is the new best.
  source.add(_items([150.0, 1.0, 2.0], [0.0, GAMMA, GAMMA]), version=0, env_steps=3)
  # Stored now: [150 (d 0), 1 (d g), 2 (d g), 1 (d 0)]: 150, 100, 200, 1.
  m = source.metrics()
  assert m["replay_terminal_fraction"] == pytest.approx(2 / 4)
  assert m["q_bound"] == pytest.approx(200.0, rel=1e-5) and m["q_floor"] == pytest.approx(1.0)


def _frame_stack(a, b):
  return np.stack([np.full((2, 2), a, np.uint8), np.full((2, 2), b, np.uint8)], -1)[None]


@pytest.mark.parametrize("replay_cls", [FrameReplayBuffer, PrioritizedFrameReplayBuffer])
def test_frame_replay_metrics_by_hand(replay_cls):
  """Two episodes of one sub-env, 2-frame stacks, 2-step returns with gamma 0.5: one of two
  steps truncated (bootstraps: not terminal), then one of one step terminated."""
  obs = _frame_stack(0, 0)
  example = ja.Transition(obs=obs[0], action=np.zeros((), np.int64),
                          reward=np.zeros((), np.float32), discount=np.zeros((), np.float32),
                          next_obs=obs[0])
  replay = replay_cls(example, capacity=32)
  source = ReplaySource(replay, batch_size=1)
  processor = FrameStepProcessor(1, obs[0], np.zeros((), np.int64), n_step=2, gamma=0.5)
  processor.reset(obs)
  a = np.zeros(1, np.int64)
  no, yes = np.array([False]), np.array([True])
  for reward, next_obs, terminated, truncated in [
      (1.0, _frame_stack(0, 1), no, no),
      (1.0, _frame_stack(1, 2), no, yes),  # truncated after 2 steps
      (0.0, _frame_stack(5, 5), no, no),  # gymnasium's autoreset step (no transition)
      (3.0, _frame_stack(5, 6), yes, no)]:  # terminated after 1 step
    source.add(processor.step(a, np.array([reward]), next_obs, terminated, truncated), 0, 1)
  # Transitions: 1 + 0.5 * 1 = 1.5 with d = 0.25 (-> 2); 1 with d = 0.5 (-> 2); 3 with d = 0.
  assert len(replay) == 3
  np.testing.assert_allclose(np.sort(replay.returns_and_discounts()[0]), [1.0, 1.5, 3.0])
  m = source.metrics()
  assert m["replay_terminal_fraction"] == pytest.approx(1 / 3)
  assert m["q_bound"] == pytest.approx(3.0) and m["q_floor"] == pytest.approx(2.0)


# --- the Q agents' figures -----------------------------------------------------------------------
def test_greedy_q_metrics_by_hand():
  q = jnp.array([[1.0, 3.0, 2.0],    # gap 1
                 [5.0, 5.0, 0.0],    # gap 0 (a tie)
                 [0.0, -1.0, -4.0],  # gap 1
                 [2.0, -2.0, 0.0],   # gap 2
                 [9.0, 0.5, 0.0]])   # gap 8.5
  m = greedy_q_metrics(q)
  assert float(m["action_gap"]) == pytest.approx(1.0)  # median of [1, 0, 1, 2, 8.5]
  assert float(m["q_max"]) == pytest.approx(9.0)
  assert float(greedy_q_metrics(jnp.ones((3, 1)))["action_gap"]) == 0.0  # one action


@pytest.mark.parametrize("config", [
    dict(), dict(loss=ja.Categorical(num_atoms=11, v_min=-5.0, v_max=5.0)),
    dict(loss=ja.QLearning(num_q_networks=3)), dict(noisy=True),
    dict(loss=ja.Munchausen(), dueling=True)],
    ids=["dqn", "c51", "ensemble", "noisy", "munchausen"])
def test_dqn_loss_reports_gap_and_max_of_its_q_values(config):
  """DQN.loss's action_gap and q_max against numpy on the same params' q_values (the expected
  Q for C51, the minimum over an ensemble; noisy nets: under the loss's own noise)."""
  agent = ja.DQN(ja.DQNConfig(hidden_sizes=(16,), batch_size=7, **config), BOX4,
                 gym.spaces.Discrete(3))
  state = agent.init(jax.random.PRNGKey(3))
  batch = jax.tree.map(jnp.asarray, random_batch(np.random.default_rng(0), (7,), 3))
  key = jax.random.PRNGKey(5) if config.get("noisy") else None
  _, (_, metrics) = agent.loss(state.params, state.target_params, batch, jnp.ones(7), key)
  noise = None if key is None else jax.random.split(key, 3)[0]  # (the loss's online(obs) key)
  q = np.asarray(agent.q_values(state.params, batch.obs, noise), np.float64)
  top2 = -np.sort(-q, axis=1)[:, :2]
  assert float(metrics["action_gap"]) == pytest.approx(np.median(top2[:, 0] - top2[:, 1]),
                                                       rel=1e-5, abs=1e-6)
  assert float(metrics["q_max"]) == pytest.approx(q.max(), rel=1e-5, abs=1e-6)
  assert float(metrics["q_mean"]) == pytest.approx(q.mean(), rel=1e-5, abs=1e-6)
  # And through update: every recorded metric is there, grad_norm included.
  _, update_metrics, _ = agent.update(state, jax.tree.map(lambda x: x[None], batch))
  assert {"action_gap", "q_max", "q_mean", "grad_norm"} <= set(update_metrics)


def test_sac_records_critic_q_stats_and_grad_norms():
  obs_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
  action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
  agent = ja.SAC(ja.SACConfig(hidden_sizes=(16,), batch_size=8), obs_space, action_space)
  state = agent.init(jax.random.PRNGKey(0))
  rng = np.random.default_rng(1)
  batch = ja.Transition(obs=rng.normal(size=(8, 3)).astype(np.float32),
                        action=rng.uniform(-1, 1, (8, 2)).astype(np.float32),
                        reward=rng.normal(size=8).astype(np.float32),
                        discount=np.full(8, GAMMA, np.float32),
                        next_obs=rng.normal(size=(8, 3)).astype(np.float32))
  _, (_, metrics) = agent.critic_loss(state.critic_params, state, batch, jnp.ones(8),
                                      jax.random.PRNGKey(1))
  q = np.asarray(agent.critic.apply(state.critic_params, batch.obs, batch.action))  # [2, B]
  assert float(metrics["q_max"]) == pytest.approx(q.min(0).max(), rel=1e-5)
  assert float(metrics["q_mean"]) == pytest.approx(q.mean(), rel=1e-5)
  _, update_metrics, _ = agent.update(state, jax.tree.map(lambda x: x[None], batch))
  assert {"q_max", "q_mean", "critic_grad_norm", "actor_grad_norm", "entropy"} <= set(
      update_metrics)
  assert float(update_metrics["actor_grad_norm"]) > 0


# --- the overestimation warning ------------------------------------------------------------------
def _ledger(tmp_path=None) -> RunLedger:
  config = ja.RunConfig(progress=False, logdir=None if tmp_path is None else str(tmp_path))
  agent = ja.DQN(ja.DQNConfig(), *ja.envs.spaces_of(ja.EnvFactory("CartPole-v1")))
  learner = types.SimpleNamespace(agent=agent, opt_steps=0)
  return RunLedger(config, learner, NullRecorder())


def test_over_bound_margin():
  assert overestimation_margin(100.0) == pytest.approx(6.0)  # 5% of |100| + 1
  assert overestimation_margin(100.0, 1.0) == pytest.approx(6.0)  # CartPole: floor 1
  assert overestimation_margin(-20.0) == pytest.approx(2.0)
  # Pendulum-like: bound near 0, values down to -1,600: 5% of the span's size + 1.
  assert overestimation_margin(-0.001, -1600.0) == pytest.approx(81.0)
  assert over_bound({"q_max": 106.0, "q_bound": 100.0}) is False  # at the margin: not over
  assert over_bound({"q_max": 106.01, "q_bound": 100.0, "q_floor": 1.0}) is True
  assert over_bound({"q_max": -17.9, "q_bound": -20.0}) is True
  assert over_bound({"q_max": 4.0, "q_bound": -0.001, "q_floor": -1600.0}) is False
  assert over_bound({"q_max": 500.0}) is None  # no bound: no verdict


def test_the_warning_fires_once_after_three_records_in_a_row(tmp_path, caplog):
  assert OVERESTIMATION_RECORDS == 3
  ledger = _ledger(tmp_path)
  over = {"q_max": 120.0, "q_bound": 100.0, "q_mean": 90.0}
  under = {"q_max": 99.0, "q_bound": 100.0, "q_mean": 80.0}
  steps = iter(range(500, 100_000, 500))

  def record(values):
    opt = next(steps)
    ledger.learner.opt_steps = opt
    ledger.on_record(opt, 4 * opt, {"fps": 1.0, **values})
    return opt

  with caplog.at_level(logging.WARNING, logger="jaxasync"):
    record(over), record(over), record(under)  # two in a row, then broken
    record(over), record(over)  # two again
    assert ledger.warnings == [] and not caplog.records
    third = record(over)
    assert len(ledger.warnings) == 1 and len(caplog.records) == 1
    for _ in range(5):
      record(over)
    record(under)
    record(over), record(over), record(over)  # a new streak: still only the one warning
  assert len(ledger.warnings) == 1 and len(caplog.records) == 1
  message = ledger.warnings[0]
  assert caplog.records[0].getMessage() == message and "\n" not in message
  for part in (f"SGD step {third}", f"env step {4 * third}", "q_max 120", "q_bound 100",
               "overestimation", "collapse", "layer_norm=True", "learning rate"):
    assert part in message, (part, message)
  # The health series: one entry per record, with the record's figures (not fps).
  assert len(ledger.health) == 15
  assert ledger.health[0] == {"opt_steps": 500, "env_steps": 2000, **over}
  ledger.write_summary(ledger.summary(0, 0))
  on_disk = json.loads((tmp_path / "summary.json").read_text())
  assert on_disk["warnings"] == [message] and on_disk["health"] == ledger.health


def test_the_watch_survives_a_resume():
  ledger = _ledger()
  for opt in (500, 1000):
    ledger.on_record(opt, opt, {"q_max": 120.0, "q_bound": 100.0})
  state = json.loads(json.dumps(ledger.state_dict()))  # (as checkpoint meta: JSON)
  resumed = _ledger()
  resumed.load_state_dict(state)
  assert resumed.health == ledger.health and resumed.over_bound_streak == 2
  resumed.on_record(1500, 1500, {"q_max": 120.0, "q_bound": 100.0})
  assert len(resumed.warnings) == 1  # the third record in a row, across the resume
  again = _ledger()
  again.load_state_dict(json.loads(json.dumps(resumed.state_dict())))
  again.on_record(2000, 2000, {"q_max": 120.0, "q_bound": 100.0})
  assert again.warnings == resumed.warnings  # kept, and not repeated


# --- a short run: the series in summary.json, and its plot -----------------------------------------
@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("health_run")
  env = ja.EnvFactory("CartPole-v1")
  agent = ja.DQN(ja.DQNConfig(hidden_sizes=(32,), batch_size=32,
                              loss=ja.QLearning(bound_targets=True),
                              data=ja.ReplayConfig(warmup_period=200, replay_capacity=10_000)),
                 *ja.envs.spaces_of(env), env_id="CartPole-v1")
  recorder = ja.MemoryRecorder()
  config = ja.RunConfig(max_opts=200, eval_interval=100, record_interval=50,
                        updates_per_call=4, eval_episodes=2, logdir=str(model_dir),
                        progress=False)
  summary = ja.Trainer(agent, env, config, ja.ActorsConfig(num_envs=4),
                       recorder=recorder).train()
  return summary, recorder, model_dir


def test_short_run_records_the_health_series(short_run):
  summary, recorder, model_dir = short_run
  on_disk = json.loads((model_dir / "summary.json").read_text())
  health = on_disk["health"]
  assert [h["opt_steps"] for h in health] == [52, 100, 152, 200]  # (4 SGD steps per call)
  for h in health:
    assert {"opt_steps", "env_steps", "q_mean", "q_max", "q_bound", "action_gap",
            "replay_terminal_fraction", "target_clipped", "grad_norm"} <= set(h)
    assert 0.0 <= h["target_clipped"] <= 1.0
    # CartPole: reward 1 per step, so every non-terminal item is worth 1 / (1 - 0.99).
    assert h["q_bound"] == pytest.approx(100.0, rel=1e-4)
    assert h["q_floor"] == pytest.approx(1.0)  # a terminal step alone: R = 1, d = 0
    assert 0 < h["replay_terminal_fraction"] < 0.5 and h["action_gap"] >= 0
    assert h["q_max"] >= h["q_mean"]
  assert health == sorted(health, key=lambda h: h["env_steps"])
  # The same figures went to the recorder (TensorBoard in a real run).
  assert [v for _, v in recorder.series("q_bound")] == [h["q_bound"] for h in health]
  assert [v for _, v in recorder.series("action_gap")] == [h["action_gap"] for h in health]
  assert not any("Q-values above" in w for w in on_disk["warnings"])


def test_plot_health_draws_the_run(short_run, tmp_path):
  pytest.importorskip("matplotlib")
  summary, _, model_dir = short_run
  png = tmp_path / "health.png"
  fig = plot.plot_health([model_dir, model_dir / "summary.json", summary], out=png,
                         labels=["dir", "file", "dict"])
  assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000
  axes = np.asarray(fig.axes).reshape(-1, 3)  # (rows, runs)
  # Eval returns, then Q, action gap, terminal fraction, targets clipped, grad norm (no
  # entropy for DQN).
  assert axes.shape[0] == 6
  q_axis = axes[1, 0]
  lines = {line.get_label(): line for line in q_axis.lines}
  assert set(lines) == {"q_max", "q_mean", "q_bound", "+ margin"}
  assert lines["q_bound"].get_linestyle() == "--"
  np.testing.assert_allclose(lines["q_bound"].get_xdata(),
                             [h["env_steps"] for h in summary["health"]])
  np.testing.assert_allclose(lines["+ margin"].get_ydata(),
                             [h["q_bound"] + 0.05 * 100 + 1 for h in summary["health"]], rtol=1e-4)
  plot._pyplot().close(fig)
