"""Where a run's learner and actors run: usable cores, explicit pinning, and auto placement
claiming cores so that runs side by side take different ones."""

import functools
import multiprocessing as mp
import os

import pytest

import jaxasync as ja
from jaxasync import placement
from jaxasync.placement import claim, place, usable_cores

needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"),
                                    reason="no CPU affinity on this platform")


@needs_affinity
def test_usable_cores_are_the_affinity_not_the_machine(monkeypatch):
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {7, 3})
  assert usable_cores() == (3, 7)
  assert ja.config.default_actor_mode() == "process"
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5})  # taskset -c 5: one core
  assert ja.config.default_actor_mode() == "sync"


def test_explicit_pinning_uses_the_usable_cores_whatever_runs_there(tmp_path):
  p = place(3, True, cores=(2, 5, 7), directory=str(tmp_path))
  assert (p.learner_core, p.actor_cores) == (2, (5, 7, 5))
  assert p.claimed_cores == ()  # (no claim: True pins even where another run is)
  one = place(2, True, cores=(4,), directory=str(tmp_path))
  assert (one.learner_core, one.actor_cores) == (4, (4, 4))


def test_no_pinning():
  p = place(2, False, cores=(0, 1, 2))
  assert not p.pinned and p.actor_cores == (None, None)


def test_auto_placement_pins_a_run_that_fills_the_cores_and_only_one(tmp_path):
  d = str(tmp_path)
  first = place(2, "auto", cores=(0, 1, 2), directory=d)
  assert (first.learner_core, first.actor_cores) == (0, (1, 2))
  assert first.claimed_cores == (0, 1, 2)
  second = place(2, "auto", cores=(0, 1, 2), directory=d)  # a run beside it stays unpinned
  assert not second.pinned and "another jaxasync run holds" in second.how
  first.release()
  first.release()  # (idempotent)
  again = place(2, "auto", cores=(0, 1, 2), directory=d)
  assert (again.learner_core, again.actor_cores) == (0, (1, 2))
  again.release()


@pytest.mark.parametrize("num_actors, cores", [(1, (0, 1, 2, 3)), (3, (0, 1, 2))])
def test_auto_placement_stays_unpinned_unless_one_core_each_fills_the_machine(
    tmp_path, num_actors, cores):
  # Spare cores: an actor's env threads may use them, and runs side by side would all take
  # the first ones. Too few: actors would share cores.
  p = place(num_actors, "auto", cores=cores, directory=str(tmp_path))
  assert not p.pinned and p.actor_cores == (None,) * num_actors
  assert f"would take {num_actors + 1} cores, one each; {len(cores)} usable" in p.how
  held = claim(cores, len(cores), str(tmp_path))  # (it claimed nothing)
  assert held is not None
  for _, f in held:
    f.close()


def _claim_and_die(directory, ready):
  held = claim((0, 1), 2, directory)
  assert held is not None
  ready.set()
  os._exit(0)  # (no clean-up: the kernel drops the flocks with the process)


def test_a_dead_runs_claims_are_free_again(tmp_path):
  ctx = mp.get_context("spawn")
  ready = ctx.Event()
  child = ctx.Process(target=_claim_and_die, args=(str(tmp_path), ready))
  child.start()
  child.join(60)
  assert ready.is_set() and child.exitcode == 0
  held = claim((0, 1), 2, str(tmp_path))
  assert held is not None and [c for c, _ in held] == [0, 1]
  for _, f in held:
    f.close()


@needs_affinity
@pytest.mark.skipif(len(usable_cores()) < 2, reason="auto placement needs 2 usable cores")
def test_a_process_run_is_placed_automatically_and_gives_its_cores_back(tmp_path, monkeypatch):
  monkeypatch.setattr(placement, "claims_dir", lambda: str(tmp_path / "claims"))
  cores = usable_cores()[:2]  # (one learner and one actor fill them)
  monkeypatch.setattr(placement, "usable_cores", lambda: cores)
  before = os.sched_getaffinity(0)
  env = ja.EnvFactory("CartPole-v1")
  agent_factory = functools.partial(  # (pickled for the actor's process)
      ja.DQN, ja.DQNConfig(batch_size=32, data=ja.ReplayConfig(warmup_period=64)),
      *ja.envs.spaces_of(env))
  run = ja.RunConfig(max_opts=200, eval_interval=0, record_interval=0, progress=False)
  summary = ja.Trainer(agent_factory(), env, run, ja.ActorsConfig(mode="process"),
                       agent_factory=agent_factory).train()
  assert summary["placement"] == (f"pinned (auto): learner on core {cores[0]}, actors on "
                                  f"[{cores[1]}]")
  assert summary["opt_steps"] == 200
  assert os.sched_getaffinity(0) == before  # the loop's thread is unpinned again
  held = claim(cores, 2, str(tmp_path / "claims"))  # and the claims are free
  assert held is not None
  for _, f in held:
    f.close()


class _FailingStart:
  mode, num_actors, configs = "process", 1, [ja.ActorConfig()]

  def start(self):
    raise OSError("spawn failed")


@needs_affinity
def test_a_feed_that_fails_to_start_unpins_and_gives_its_cores_back(tmp_path):
  from jaxasync.loop import ActorFeed
  before = os.sched_getaffinity(0)
  cores = usable_cores()[:2]
  feed = ActorFeed(_FailingStart(), ja.ChunkQueue(4),
                   place=lambda: place(1, True, cores=cores, directory=str(tmp_path)))
  with pytest.raises(OSError, match="spawn failed"):
    feed.start()
  assert os.sched_getaffinity(0) == before
  auto = ActorFeed(_FailingStart(), ja.ChunkQueue(4),
                   place=lambda: place(1, "auto", cores=cores, directory=str(tmp_path)))
  with pytest.raises(OSError, match="spawn failed"):
    auto.start()
  held = claim(cores, 2, str(tmp_path))  # (auto had claimed them)
  assert held is not None
  for _, f in held:
    f.close()


def test_pin_cpus_takes_true_false_or_auto_only():
  for bad in (0, 1, "yes", None):
    with pytest.raises(ja.ConfigError, match="pin_cpus must be True, False or 'auto'"):
      ja.ActorsConfig(mode="process", pin_cpus=bad).validate()
  with pytest.raises(ValueError, match="pin must be"):
    place(1, 0, cores=(0, 1))


def test_a_lock_step_run_takes_pin_cpus_false():
  ja.ActorsConfig(mode="sync", pin_cpus=False).validate()  # (nothing pinned, as asked)
  with pytest.raises(ja.ConfigError, match="pin_cpus=True"):
    ja.ActorsConfig(mode="sync", pin_cpus=True).validate()
