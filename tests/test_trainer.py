"""Tests for the synchronous Trainer: validation, checkpoints/summary/records, and learning."""

import json

import chex
import jax
import numpy as np
import pytest

from jaxasync import (ActorsConfig, ConfigError, DQN, DQNConfig, EnvFactory, MemoryRecorder,
                      ReplayConfig, RunConfig, Trainer, restore_checkpoint)
from jaxasync.envs import spaces_of

CARTPOLE = EnvFactory("CartPole-v1")


@pytest.fixture(scope="module")
def cartpole_spaces():
  return spaces_of(CARTPOLE)


def _dqn(spaces, **config):
  return DQN(DQNConfig(**config), *spaces, env_id="CartPole-v1")


# --- validation ------------------------------------------------------------------
def test_batch_larger_than_warmup_is_rejected(cartpole_spaces):
  # (The replay's settings are the agent's data: building the agent checks them.)
  with pytest.raises(ConfigError, match="Raise warmup_period or lower batch_size") as e:
    agent = _dqn(cartpole_spaces, batch_size=128, data=ReplayConfig(warmup_period=64))
    Trainer(agent, CARTPOLE, RunConfig(progress=False))
  assert "batch_size=128" in str(e.value) and "warmup_period=64" in str(e.value)
  ReplayConfig(warmup_period=128).validate(128)  # equal is fine


# Each setting is checked by its owner: the run's (RunConfig), the actors' (ActorsConfig), or
# the agent's data pipeline (ReplayConfig, checked when the agent is built).
@pytest.mark.parametrize("owner, config, message", [
    ("data", dict(n_step=0), "n_step must be >= 1, got 0"),
    ("data", dict(gamma=1.5), r"gamma must be in \[0, 1\], got 1.5"),
    ("data", dict(gamma=-0.1), r"gamma must be in \[0, 1\]"),
    ("data", dict(warmup_period=2_000, replay_capacity=1_000),
     "Lower warmup_period or raise replay_capacity"),
    ("run", dict(updates_per_call=0), "updates_per_call must be >= 1, got 0"),
    ("actors", dict(num_envs=0), "num_envs must be >= 1, got 0"),
    ("data", dict(opt_interval=0.0), "opt_interval must be a finite number > 0"),
    ("data", dict(opt_interval=float("nan")), "opt_interval must be a finite number > 0"),
    ("run", dict(duration=-5.0), r"duration must be a finite number of seconds > 0.*got -5.0"),
    ("run", dict(duration=0.0), "duration must be a finite number of seconds > 0"),
    ("run", dict(duration=float("nan")), "duration must be .*got nan"),
    ("run", dict(max_env_steps=-1), r"max_env_steps must be >= 1.*got -1"),
])
def test_bad_trainer_config_is_rejected(cartpole_spaces, owner, config, message):
  with pytest.raises(ConfigError, match=message):
    if owner == "data":
      ReplayConfig(**config).validate(32)
    elif owner == "actors":
      ActorsConfig(**config).validate()
    else:
      RunConfig(**config).validate()
  data = ReplayConfig(**config) if owner == "data" else ReplayConfig()
  run = RunConfig(progress=False, **(config if owner == "run" else {}))
  actors = ActorsConfig(**(config if owner == "actors" else {}))
  with pytest.raises(ConfigError, match=message):  # before any env is built
    agent = _dqn(cartpole_spaces, batch_size=32, data=data)
    Trainer(agent, EnvFactory("NoSuchEnv-v0"), run, actors)


@pytest.mark.parametrize("data, config", [
    (dict(warmup_period=64), dict(updates_per_call=4)),  # one call samples 4 * 32 items
    (dict(warmup_period=32, n_step=3), dict(updates_per_call=1)),  # n-step lag: < 32 transitions
], ids=["k_batches", "n_step_lag"])
def test_a_validated_config_never_samples_more_than_stored(cartpole_spaces, data, config):
  """A config that passes validation must train (or be rejected up front with a ConfigError)."""
  try:
    agent = _dqn(cartpole_spaces, hidden_sizes=(16,), batch_size=32, data=ReplayConfig(**data))
    trainer = Trainer(agent, CARTPOLE, RunConfig(max_opts=40, eval_interval=0,
                                                 eval_episodes=1, progress=False, **config))
  except ConfigError:
    return
  assert trainer.train()["opt_steps"] == 40


def test_unknown_env_id():
  with pytest.raises(ConfigError, match="it is not registered with gymnasium") as e:
    EnvFactory("NoSuchEnv-v0")(1)
  assert "'NoSuchEnv-v0'" in str(e.value) and "module:EnvName-v0" in str(e.value)
  with pytest.raises(ConfigError, match="Did you mean") as e:
    EnvFactory("CartPole-v9")(1)
  assert "CartPole-v1" in str(e.value)


def test_module_env_id_with_missing_module():
  with pytest.raises(ConfigError, match="cannot import module 'no_such_module_xyz'") as e:
    EnvFactory("no_such_module_xyz:Foo-v0")(1)
  assert "install it or fix the 'module:EnvName-v0' id" in str(e.value)
  # An importable module whose env is not registered: the id part is checked too.
  with pytest.raises(ConfigError, match="not registered"):
    EnvFactory("json:NoSuchEnv-v0")(1)


def test_num_envs_zero_is_rejected():
  with pytest.raises(ConfigError, match="num_envs must be >= 1"):
    CARTPOLE(0)


# --- a short synchronous run ---------------------------------------------------------
SUMMARY_KEYS = {"samples_total", "opt_steps", "wall_s", "samples_per_sec", "opt_steps_per_sec",
                "samples_per_opt_steps", "best_eval_reward", "final_eval_reward"}
RECORD_KEYS = {"env_steps", "fps", "opt_steps", "opt_steps_per_sec", "samples_per_sec", "loss",
               "eval_reward"}


@pytest.fixture(scope="module")
def short_run(tmp_path_factory, cartpole_spaces):
  model_dir = tmp_path_factory.mktemp("run")
  agent = _dqn(cartpole_spaces, hidden_sizes=(32,), batch_size=32,
               data=ReplayConfig(warmup_period=200, replay_capacity=10_000))
  recorder = MemoryRecorder()
  config = RunConfig(max_opts=200, eval_interval=100, save_interval=100, record_interval=50,
                     updates_per_call=4, eval_episodes=2, logdir=str(model_dir), progress=False)
  trainer = Trainer(agent, CARTPOLE, config, ActorsConfig(num_envs=4), recorder=recorder)
  summary = trainer.train()
  return trainer, summary, recorder, model_dir


def test_short_run_writes_checkpoints(short_run):
  trainer, _, _, model_dir = short_run
  names = {p.name for p in model_dir.iterdir()}
  assert {"best", "100", "200", "final", "summary.json"} <= names
  assert not any(n.endswith(".tmp") for n in names)
  template = trainer.agent.init(jax.random.PRNGKey(42))
  for name, opt_steps in [("100", 100), ("200", 200), ("final", 200)]:
    state, meta = restore_checkpoint(model_dir / name, template)
    assert int(state.opt_steps) == opt_steps, name
    assert meta["opt_steps"] == opt_steps and meta["env_steps"] > 0
  state, _ = restore_checkpoint(model_dir / "final", template)
  chex.assert_trees_all_equal(state, jax.device_get(trainer.learner.state))
  _, best_meta = restore_checkpoint(model_dir / "best", template)
  assert best_meta["opt_steps"] in (100, 200)
  assert best_meta["eval_reward"] == trainer.ledger.best_eval_reward


def test_short_run_summary(short_run):
  trainer, summary, _, model_dir = short_run
  on_disk = json.loads((model_dir / "summary.json").read_text())
  assert SUMMARY_KEYS <= set(on_disk)
  assert on_disk["opt_steps"] == summary["opt_steps"] == 200
  assert on_disk["samples_total"] == trainer.replay.added_total > 0
  assert on_disk["samples_per_opt_steps"] == pytest.approx(on_disk["samples_total"] / 200)
  assert on_disk["wall_s"] > 0
  assert on_disk["opt_steps_per_sec"] == pytest.approx(200 / on_disk["wall_s"])
  assert on_disk["samples_per_sec"] == pytest.approx(on_disk["samples_total"] / on_disk["wall_s"])
  evals = [e["eval_reward"] for e in on_disk["evals"]]
  assert [e["opt_steps"] for e in on_disk["evals"]] == [100, 200]
  assert on_disk["best_eval_reward"] == max(evals) >= 8  # CartPole lasts >= 8 steps
  assert on_disk["final_eval_reward"] == evals[-1]
  assert on_disk["mode"] == "sync"
  # One opt step per env step once env_steps reaches the warmup of 200 (4 env steps and one
  # 4-step update per iteration): iterations 50..99 update, so 99 * 4 env steps in all.
  assert trainer.env_steps == on_disk["env_steps"] == 396


def test_short_run_records(short_run):
  _, summary, recorder, _ = short_run
  seen = set().union(*(values for _, values in recorder.records))
  assert RECORD_KEYS <= seen, RECORD_KEYS - seen
  # Updates advance 4 steps at a time: a record fires on the first count past each multiple of 50.
  assert [s for s, _ in recorder.series("opt_steps")] == [52, 100, 152, 200]
  assert [v for _, v in recorder.series("opt_steps")] == [52, 100, 152, 200]
  assert [v for _, v in recorder.series("eval_reward")] == [e["eval_reward"]
                                                          for e in summary["evals"]]
  env_steps = [v for _, v in recorder.series("env_steps")]
  assert env_steps == sorted(env_steps) and env_steps[0] >= 200
  assert all(np.isfinite(v) and v >= 0 for _, v in recorder.series("loss"))
  assert all(v > 0 for _, v in recorder.series("fps"))


# --- learning ------------------------------------------------------------------------
@pytest.mark.slow
def test_dqn_solves_cartpole(tmp_path, cartpole_spaces):
  agent = _dqn(cartpole_spaces)
  config = RunConfig(max_opts=40_000, target_eval_reward=475, seed=0, progress=False,
                     logdir=str(tmp_path))
  summary = Trainer(agent, CARTPOLE, config).train()
  assert summary["best_eval_reward"] >= 475, summary["evals"]
  assert summary["solved_at"] is not None
  assert summary["opt_steps"] < 40_000  # stopped early on reaching the target


def test_checkpoint_meta_holds_numpy_rng_states(short_run):
  trainer, _, _, model_dir = short_run
  template = trainer.agent.init(jax.random.PRNGKey(42))
  _, meta = restore_checkpoint(model_dir / "final", template)
  assert set(meta["rng_states"]) == {"replay", "exploration"}
  # The saved replay generator state continues the buffer's own stream exactly.
  g = np.random.default_rng()
  g.bit_generator.state = meta["rng_states"]["replay"]
  expected = g.integers(0, len(trainer.replay), size=16)
  np.testing.assert_array_equal(trainer.replay.sample_indices(16), expected)


def test_request_stop_ends_a_run(cartpole_spaces):
  agent = _dqn(cartpole_spaces, hidden_sizes=(16,), batch_size=32,
               data=ReplayConfig(warmup_period=64))
  config = RunConfig(max_opts=10**9, eval_interval=0, progress=False)
  trainer = Trainer(agent, CARTPOLE, config, ActorsConfig(num_envs=2))
  trainer.ledger.request_stop(after_s=1.0)
  summary = trainer.train()
  assert 0 < summary["opt_steps"] < 10**9 and summary["wall_s"] < 10


def test_final_evaluation_is_of_the_final_params(cartpole_spaces):
  """max_opts is not a multiple of eval_interval: the run still ends with an evaluation of
  the params it ends with, so final_eval_reward describes what `final` holds."""
  agent = _dqn(cartpole_spaces, hidden_sizes=(16,), batch_size=32,
               data=ReplayConfig(warmup_period=64))
  config = RunConfig(max_opts=100, eval_interval=64, eval_episodes=2, progress=False)
  summary = Trainer(agent, CARTPOLE, config).train()
  assert summary["opt_steps"] == 100
  assert [e["opt_steps"] for e in summary["evals"]] == [64, 100]
  assert summary["final_eval_opt_steps"] == 100
  assert summary["final_eval_reward"] == summary["evals"][-1]["eval_reward"]


def test_a_sync_run_stopped_by_max_env_steps_takes_its_last_due_update(cartpole_spaces):
  """border's loop spends what an env step earned before it looks at the limits: warmup 64,
  4 envs, one SGD step per env step, one per call: 4 calls after each vector step from env
  step 64 to 200 (the replay then holds >= 56 transitions, enough for a batch of 32), so
  ((200 - 64) / 4 + 1) * 4 = 140 SGD steps when max_env_steps is 200 (136 if the last
  vector step's calls were dropped)."""
  trainer = Trainer(_dqn(cartpole_spaces, batch_size=32, data=ReplayConfig(warmup_period=64)),
                    CARTPOLE, RunConfig(updates_per_call=1, max_env_steps=200, eval_interval=0,
                                        progress=False),
                    ActorsConfig(num_envs=4))
  summary = trainer.train()
  assert summary["env_steps"] == 200 and summary["opt_steps"] == 140


class _InterruptingDQN(DQN):
  """Its third update call raises KeyboardInterrupt (a second Ctrl-C arriving mid-run)."""

  calls = 0

  def update(self, state, batch, weights=None):
    type(self).calls += 1
    if type(self).calls == 3:
      raise KeyboardInterrupt
    return super().update(state, batch, weights)


def test_a_forced_stop_saves_and_then_raises(cartpole_spaces, tmp_path):
  _InterruptingDQN.calls = 0
  agent = _InterruptingDQN(DQNConfig(batch_size=32, data=ReplayConfig(warmup_period=64)),
                           *cartpole_spaces)
  trainer = Trainer(agent, CARTPOLE, RunConfig(eval_interval=0, progress=False,
                                               logdir=str(tmp_path)))
  with pytest.raises(KeyboardInterrupt):
    trainer.train()
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["interrupted"] is True and summary["opt_steps"] == 8
  assert (tmp_path / "final" / "meta.json").exists()


def test_a_runs_own_hooks_are_called_on_their_interval_and_can_stop_it(cartpole_spaces):
  """Hooks fire after the update call that crosses a multiple of their interval (k = 4: at 52
  and 100 for 50), with the loop; one that asks the ledger to stop ends the run there."""
  seen = []

  def stop_at_100(loop):
    if loop.learner.opt_steps >= 100:
      loop.ledger.request_stop()

  from jaxasync import Hook
  trainer = Trainer(_dqn(cartpole_spaces, batch_size=32, data=ReplayConfig(warmup_period=64)),
                    CARTPOLE, RunConfig(max_opts=1_000, eval_interval=0, progress=False),
                    hooks=[Hook(50, lambda loop: seen.append(loop.learner.opt_steps), "seen"),
                           Hook(25, stop_at_100, "stop")])
  summary = trainer.train()
  assert seen == [52, 100] and summary["opt_steps"] == 100


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf")])
def test_a_replay_ratio_that_is_not_a_finite_positive_number_is_rejected(value):
  # NaN passed the old `<= 0` check: the run took no SGD step in 63k env steps.
  with pytest.raises(ConfigError, match=f"samples_per_insert must be a finite number > 0.*got {value}"):
    ReplayConfig(samples_per_insert=value).validate(32)


@pytest.mark.parametrize("num_envs, lag", [(4, 4), (8, 8)])
def test_the_lockstep_actor_on_a_replay_chooses_its_actions_before_the_calls(
    cartpole_spaces, num_envs, lag):
  """Off-policy lock-step: the actions of each vector step are chosen before the update calls
  its previous step made due (so the env steps while XLA computes them). With one SGD step
  per env step and 4 per call, that is one call (4 SGD steps) for 4 envs and two (8) for 8
  envs: once training has started every transition was chosen with params exactly that old;
  during the warmup (no update yet) the lag is 0."""
  recorder = MemoryRecorder()
  trainer = Trainer(_dqn(cartpole_spaces, hidden_sizes=(16,), batch_size=32,
                         data=ReplayConfig(warmup_period=64)),
                    CARTPOLE, RunConfig(max_opts=200, updates_per_call=4, eval_interval=0,
                                        record_interval=40, progress=False),
                    ActorsConfig(num_envs=num_envs), recorder)
  trainer.train()
  lags = [(s, v["policy_lag_min"], v["policy_lag_max"]) for s, v in recorder.records
          if "policy_lag_min" in v]
  assert len(lags) == 5 and lags[0][1] == 0  # (the first window holds the warmup's steps)
  assert all(lo == hi == lag for _, lo, hi in lags[1:]), lags


@pytest.mark.parametrize("evaluate", ["online", "target"])
def test_evaluations_run_the_network_the_config_names(cartpole_spaces, evaluate):
  """DQNConfig.evaluate: every evaluation (interim and final) runs the online network's
  params or the target network's, which differ while training (Polyak averaging)."""
  agent = _dqn(cartpole_spaces, hidden_sizes=(16,), batch_size=32, evaluate=evaluate,
               data=ReplayConfig(warmup_period=64))
  trainer = Trainer(agent, CARTPOLE, RunConfig(max_opts=100, eval_interval=64, eval_episodes=1,
                                               progress=False))
  evaluated, evaluate_params = [], trainer.evaluator.evaluate

  def recording(params):
    state = trainer.learner.state  # (the lock-step loop waits for its evaluations)
    evaluated.append((params, jax.device_get(state.params), jax.device_get(state.target_params)))
    return evaluate_params(params)

  trainer.evaluator.evaluate = recording
  trainer.train()
  assert len(evaluated) == 2
  for params, online, target in evaluated:
    expected, other = (online, target) if evaluate == "online" else (target, online)
    chex.assert_trees_all_equal(params, expected)
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params),
                                                          jax.tree.leaves(other)))
