"""The agent contract, end to end: every agent x {sync, async thread, async process} runs a few
hundred steps on a tiny env; the batches its update sees have the shapes its data pipeline
(``agent.data``) promises, params versions flow back to the actors, and nothing is left running.

A new agent adds a row to ``contract_agents.factories()`` (and names its env in
``contract_agents.env_factory`` when it needs continuous actions).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import contract_agents
import jaxasync as ja
from helpers import assert_no_strays
from jaxasync.types import transition_example

MODES = ["sync", "thread", "process"]


def _run(name: str, mode: str):
  factory = contract_agents.factories()[name]
  agent = factory()
  # (The replay agents' warmup_period=64 and replay_capacity=2_000 are their configs' data:
  # contract_agents.factories.)
  run = ja.RunConfig(max_opts=64, updates_per_call=2, eval_interval=32, eval_episodes=2,
                     record_interval=16, progress=False, seed=0)
  actors = ja.ActorsConfig(num_envs=3) if mode == "sync" else ja.ActorsConfig(
      mode=mode, num_actors=2, num_envs=3, chunk_steps=5, queue_size=4, sync_interval=4)
  trainer = ja.Trainer(agent, contract_agents.env_factory(name), run, actors,
                       recorder=ja.MemoryRecorder(), agent_factory=factory)
  contract_agents.SHAPES.clear()
  summary = trainer.train()
  return agent, trainer, summary


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(contract_agents.factories()))
def test_agent_contract(name, mode):
  before = {t.ident for t in threading.enumerate()}
  agent, trainer, summary = _run(name, mode)
  # It trained to the end and evaluated, with no error.
  assert summary["error"] is None and summary["opt_steps"] == 64
  assert summary["env_steps"] > 0 and summary["evals"]
  assert np.isfinite(summary["final_eval_reward"])
  # The batches had the data pipeline's shapes: [k, N, ...] transitions, [k, T+1, N * B, ...] unrolls.
  k, n = 2, agent.batch_size
  assert len(contract_agents.SHAPES) == 64 // k
  shapes = contract_agents.SHAPES[0]
  if isinstance(agent.data, ja.ReplayConfig):
    action_shape = agent.action_space.shape  # () for Discrete, (1,) for the Box
    assert shapes.obs == (k, n, 2) and shapes.action == (k, n, *action_shape)
    assert shapes.reward == (k, n)
    extras = agent.extras_example()
    assert shapes.extras == (None if extras is None else {"epsilon": (k, n)})
  else:
    envs = 3
    t1 = agent.data.unroll_length + 1
    assert shapes.obs == (k, t1, n * envs, 2) and shapes.first == (k, t1, n * envs)
    assert shapes.action == (k, t1, n * envs, *agent.action_space.shape)
    # (PQN's actors hand over no extras; IMPALA's and PPO's: the logits [2], or the Gaussian's
    # mean, log-std and raw sample [1] each.)
    extras = agent.extras_example()
    assert shapes.extras == (None if extras is None else
                             {key: (k, t1, n * envs, *np.shape(x)) for key, x in extras.items()})
  # Versions: every chunk came in order, actors ended on the learner's last publication.
  loop = trainer.loop
  assert loop.order_errors == 0 and loop.chunks_ingested > 0
  assert trainer.param_store.version == 64
  for stats in trainer.actor_stats:
    assert stats.adopted_version == 64 and stats.restarts == 0
  # Every actor ran, but a queue-fed learner may finish on one actor's unrolls before a slow
  # second process delivers its first (it happened on a loaded CI machine): at least one.
  assert trainer.actor_stats == [] or any(s.env_steps > 0 for s in trainer.actor_stats)
  assert_no_strays(before)  # clean shutdown: no thread or process left behind


def test_an_incomplete_agent_fails_at_construction_with_the_missing_member():
  class NoSelect(ja.Agent):
    def init(self, key): ...
    def update(self, state, batch, weights=None): ...
    def policy_params(self, state): ...
    def initial_actor_state(self, context): ...
    def policy(self, params, obs, rng, explore=True): ...

  with pytest.raises(TypeError, match="select"):
    NoSelect()


def test_a_non_agent_is_refused_with_the_fix():
  with pytest.raises(ja.ConfigError, match="subclass jaxasync.Agent"):
    ja.Trainer(object(), contract_agents.TinyEnvFactory(), ja.RunConfig())


def _replay_for(agent):
  return ja.ReplayBuffer(transition_example(agent.obs_space, agent.action_space, None), 100, 0)


# (Before the pipelines, agent.data was a DataSpec naming a collector and a source, and the two
# mismatching pairs were refused. A pipeline pairs them by construction: what is left to refuse
# is data that is no pipeline, and a replay handed to an agent that learns from unrolls.)
@pytest.mark.parametrize("data, replay, message", [
    (("transitions", "queue"), False, "jaxasync.pipeline data pipeline"),
    (ja.UnrollConfig(unroll_length=4), True, "takes no replay"),
    (ja.UnrollConfig(unroll_length=0), False, "unroll_length must be"),
])
def test_an_unservable_data_spec_is_refused_before_anything_runs(data, replay, message):
  agent = contract_agents.factories()["linear_pg"]()
  agent.data = data
  with pytest.raises(ja.ConfigError, match=message):
    ja.Trainer(agent, contract_agents.TinyEnvFactory(), ja.RunConfig(progress=False),
               replay=_replay_for(agent) if replay else None)
