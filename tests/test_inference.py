"""The SEED-style InferenceServer: batching, answers equal to local acting, params following."""

from __future__ import annotations

import threading

import jax
import numpy as np

import jaxasync as ja
from helpers import BOX4
import gymnasium as gym


def _setup(**server_kw):
  agent = ja.DQN(ja.DQNConfig(hidden_sizes=(8,)), BOX4, gym.spaces.Discrete(3))
  learner_params = agent.init(jax.random.PRNGKey(0)).params
  store = ja.ThreadParamStore()
  store.publish(ja.ModelInfo(7, jax.tree.map(np.array, learner_params)))
  server = ja.InferenceServer(agent, store, **server_kw)
  return agent, store, server, learner_params


def test_batches_requests_and_answers_like_local_acting():
  agent, store, server, params = _setup(num_clients=3, batch_size=3, delay=1.0)
  server.start()
  stop = threading.Event()
  rng = np.random.default_rng(0)
  obs = [rng.normal(size=(2, 4)).astype(np.float32) for _ in range(3)]
  answers = [None] * 3

  def ask(i):
    answers[i] = server.client(i).policy(obs[i], stop)

  threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(10)
  server.stop()
  server.check()
  assert server.requests_served == 3 and server.batches == 1  # one batch of three actors
  for i in range(3):
    actions, version = answers[i]
    assert version == 7
    np.testing.assert_array_equal(actions, np.asarray(agent.greedy_actions(params, obs[i])))


def test_follows_new_publications_and_delay_bounds_waiting():
  agent, store, server, params = _setup(num_clients=1, batch_size=8, delay=0.001, device="cpu")
  server.start()
  stop = threading.Event()
  client = server.client(0)
  obs = np.ones((4, 4), np.float32)
  _, v0 = client.policy(obs, stop)  # a lone request is served after `delay`
  new_params = jax.tree.map(lambda x: np.array(x) * -1.0, params)
  store.publish(ja.ModelInfo(9, new_params))
  actions, v1 = client.policy(obs, stop)
  server.stop()
  assert (v0, v1) == (7, 9)
  np.testing.assert_array_equal(actions, np.asarray(agent.greedy_actions(new_params, obs)))
  assert server.batches == 2


def test_stop_unblocks_a_waiting_client():
  _, _, server, _ = _setup(num_clients=1)  # never started: nobody answers
  stop = threading.Event()
  stop.set()
  assert server.client(0).policy(np.zeros((1, 4), np.float32), stop) is None
