"""The contracts written as Protocols hold for every implementation the library ships."""
import inspect
import pickle

import contract_agents
import faulty_envs
import jaxasync as ja
from jaxasync.actor_manager import ActorManager, Actors
from jaxasync.collectors import Collector
from jaxasync.loop import ActorFeed, Feed, LockstepFeed
from jaxasync.sources.base import DataSource
from jaxasync.sources.queue import QueueSource
from jaxasync.sources.replay import ReplaySource


def _members(protocol) -> set[str]:
  names = set(getattr(protocol, "__annotations__", {}))
  names |= {n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")}
  names |= {n for n, v in vars(protocol).items() if isinstance(v, property)}
  return names


def test_every_shipped_implementation_has_every_member_of_its_contract():
  env = ja.EnvFactory("CartPole-v1")
  obs_space, action_space = ja.envs.spaces_of(env)
  dqn = ja.DQN(ja.DQNConfig(batch_size=8, data=ja.ReplayConfig(warmup_period=8)), obs_space,
               action_space)
  ppo = ja.PPO(ja.PPOConfig(), obs_space, action_space)
  lockstep = ja.Trainer(dqn, env, ja.RunConfig(max_opts=1, progress=False))
  replay_source = lockstep.source
  queue_source = ja.Trainer(ppo, env, ja.RunConfig(max_opts=1, progress=False)).source
  assert isinstance(replay_source, ReplaySource) and isinstance(queue_source, QueueSource)
  for source in (replay_source, queue_source):
    missing = {m for m in _members(DataSource) if not hasattr(source, m)}
    assert not missing, (type(source).__name__, missing)
  missing = {m for m in _members(Feed) if not hasattr(lockstep.feed, m)}
  assert isinstance(lockstep.feed, LockstepFeed) and not missing, missing
  for cls in (ActorFeed, ActorManager):
    protocol = Feed if cls is ActorFeed else Actors
    # (instances need actors; the class must define the methods, __init__ the attributes)
    methods = {m for m in _members(protocol) if callable(getattr(protocol, m, None))}
    assert methods <= set(dir(cls)), (cls.__name__, methods - set(dir(cls)))
  collector = lockstep.feed.actor.collector
  assert {m for m in _members(Collector) if not hasattr(collector, m)} == set()
  lockstep.feed.close()


def test_every_env_factory_keeps_the_vector_env_factory_contract():
  """The library's factories and the tests' own: every member of ``VectorEnvFactory``, a
  ``(num_envs, seed)`` call, and a pickle round trip (actor processes rebuild envs from one).
  (Atari's is only constructed: that needs no ROMs.)"""
  factories = [ja.EnvFactory("CartPole-v1"), ja.MinAtarEnvFactory("MinAtar/Breakout-v1"),
               ja.AtariEnvFactory("ALE/Pong-v5"), contract_agents.TinyEnvFactory(),
               faulty_envs.RaisingEnvFactory(), faulty_envs.HangingEnvFactory()]
  members = _members(ja.VectorEnvFactory)
  assert members >= {"env_id", "frame_skip"}, members
  for factory in factories:
    name = type(factory).__name__
    assert {m for m in members if not hasattr(factory, m)} == set(), name
    assert isinstance(factory.env_id, str) and factory.env_id, name
    assert isinstance(factory.frame_skip, int) and factory.frame_skip >= 1, name
    inspect.signature(factory).bind(1, seed=0)
    assert pickle.loads(pickle.dumps(factory)) == factory, name
  assert [f.frame_skip for f in factories[:3]] == [1, 1, 4]
