"""The settings no agent owns (jaxasync.config): a lock-step run refuses the actor fields it
would ignore, and the experiment scripts' own defaults for those fields do not count as set."""

from __future__ import annotations

import dataclasses

import pytest
import tyro

import jaxasync as ja
from jaxasync import config, experiment

import dqn  # experiments/dqn.py (experiments/ is on pytest's pythonpath)
import impala
import pqn
import rainbow


def test_the_lockstep_actor_reads_mode_and_num_envs_only():
  assert set(ja.ActorsConfig.actor_fields()) == (
      {f.name for f in dataclasses.fields(ja.ActorsConfig)} - {"mode", "num_envs"})
  ja.ActorsConfig(mode="sync", num_envs=16).validate()
  assert ja.ActorsConfig(mode="sync", num_envs=16).set_actor_fields() == {}


@pytest.mark.parametrize("changes", [
    dict(num_actors=4), dict(queue_size=8, drop_when_full=True), dict(sync_interval=10),
    dict(inference_servers=1), dict(ray_address="auto"), dict(pin_cpus=True, max_restarts=0)])
def test_a_sync_run_refuses_the_actor_fields_it_would_ignore(changes):
  with pytest.raises(ja.ConfigError) as e:
    ja.ActorsConfig(mode="sync", **changes).validate()
  message = str(e.value)
  assert "\n" not in message and "mode 'sync'" in message
  for name, value in changes.items():
    assert f"{name}={value!r}" in message
  assert "drop them, or use mode 'thread' or 'process'" in message
  ja.ActorsConfig(mode="thread", **{k: v for k, v in changes.items() if k != "ray_address"}
                  ).validate()  # where they apply


def test_auto_is_checked_as_the_mode_it_resolves_to(monkeypatch):
  monkeypatch.setattr(config, "usable_cores", lambda: (0,))
  with pytest.raises(ja.ConfigError, match=r"mode 'auto' \(here 'sync': one core\).*num_actors=2"):
    ja.ActorsConfig(mode="auto", num_actors=2).validate()
  monkeypatch.setattr(config, "usable_cores", lambda: (0, 1, 2, 3))
  ja.ActorsConfig(mode="auto", num_actors=2).validate()


def test_the_trainer_refuses_it_before_building_anything():
  agent = ja.DQN(ja.DQNConfig(batch_size=32), *ja.envs.spaces_of(ja.EnvFactory("CartPole-v1")))
  with pytest.raises(ja.ConfigError, match="num_actors=4"):
    ja.Trainer(agent, ja.EnvFactory("NoSuchEnv-v0"), ja.RunConfig(progress=False),
               ja.ActorsConfig(mode="sync", num_actors=4))


@pytest.mark.parametrize("module, argv", [
    (dqn, ["--mode", "sync"]),  # sync_interval=10 (the scripts' async publication)
    (impala, ["--mode", "sync"]),  # sync_interval=1 (on_policy_actors)
    (impala, ["--preset", "minatar", "--mode", "sync"]),  # the preset's num_envs
    (pqn, []),  # the cartpole preset is lock-step
    (pqn, ["--preset", "minatar", "--mode", "sync"]),  # the preset's sync_interval, queue_size
    (rainbow, ["--preset", "atari", "--mode", "sync"]),
])
def test_a_scripts_own_actor_defaults_give_way_to_mode_sync(module, argv):
  args = (module.parse(argv) if hasattr(module, "parse")
          else tyro.cli(module.Args, args=argv))
  actors = experiment.lockstep_actors(args.actors, args.preset_defaults().actors)
  assert actors.lockstep and actors.num_envs == args.actors.num_envs
  assert actors.set_actor_fields() == {}
  actors.validate()


def test_an_actor_flag_the_user_gives_with_mode_sync_is_refused_by_its_flag(tmp_path):
  args = tyro.cli(dqn.Args, args=["--mode", "sync", "--num-actors", "4", "--queue-size", "2",
                                  "--no-progress", "--logdir", str(tmp_path / "run")])
  actors = experiment.lockstep_actors(args.actors, args.preset_defaults().actors)
  assert actors.set_actor_fields() == {"num_actors": 4, "queue_size": 2}
  with pytest.raises(ja.ConfigError) as e:
    dqn.main(args)
  message = str(e.value)
  assert "num_actors=4 (--num-actors)" in message and "queue_size=2 (--queue-size)" in message
  assert not (tmp_path / "run").exists()  # refused before the logdir is touched


def test_async_modes_keep_every_field():
  actors = ja.ActorsConfig(mode="process", num_actors=3, sync_interval=10, pin_cpus=True)
  assert experiment.lockstep_actors(actors, ja.ActorsConfig()) is actors
