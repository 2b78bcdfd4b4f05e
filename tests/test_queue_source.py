"""Tests for the FIFO on-policy queue source."""

import chex
import numpy as np
import pytest

from jaxasync.sources.queue import QueueSource, Sample


def _item(i):
  """A time-major item ``[T + 1 = 2, B = 2, ...]`` whose leaves encode its id ``i``.

  ``x[t, b] = 100 i + 10 t + b``; ``y[t, b] = [i, -i]``.
  """
  x = 100 * i + 10 * np.arange(2)[:, None] + np.arange(2)[None, :]
  y = np.broadcast_to(np.array([i, -i], np.float32), (2, 2, 2))
  return {"x": x.astype(np.int64), "y": y.copy()}


def _ids(sample):
  """Item ids in a sample's batch, ``[k, items_per_batch]`` (column b = 0 of each item)."""
  x = sample.batch["x"]
  return x[:, 0, ::2] // 100  # B = 2 columns per item


def test_concatenates_along_the_batch_axis_and_stacks_updates():
  q = QueueSource(capacity=8, items_per_batch=2, updates_per_call=2)
  for i in range(4):
    q.add(_item(i), version=0)
  s = q.sample(opt_steps=0)
  assert isinstance(s, Sample) and s.weights is None and s.info is None
  chex.assert_shape(s.batch["x"], (2, 2, 4))  # [k, T + 1, items_per_batch * B]
  chex.assert_shape(s.batch["y"], (2, 2, 4, 2))
  np.testing.assert_array_equal(s.batch["x"], [
      [[0, 1, 100, 101], [10, 11, 110, 111]],
      [[200, 201, 300, 301], [210, 211, 310, 311]]])
  np.testing.assert_array_equal(s.batch["y"][1, 0], [[2, -2], [2, -2], [3, -3], [3, -3]])
  assert len(q) == 0


def test_batch_axis_zero():
  q = QueueSource(capacity=2, items_per_batch=2, batch_axis=0)
  q.add(np.array([1, 2]), version=0)
  q.add(np.array([3]), version=0)
  np.testing.assert_array_equal(q.sample(0).batch, [[1, 2, 3]])  # k = 1 still stacked


def test_fifo_order_across_sample_calls():
  q = QueueSource(capacity=5, items_per_batch=2)
  for i in range(3):
    q.add(_item(i), version=0)
  np.testing.assert_array_equal(_ids(q.sample(0)), [[0, 1]])
  q.add(_item(3), version=0)
  q.add(_item(4), version=0)
  np.testing.assert_array_equal(_ids(q.sample(0)), [[2, 3]])
  assert len(q) == 1
  assert not q.can_sample(0)
  q.add(_item(5), version=0)
  np.testing.assert_array_equal(_ids(q.sample(0)), [[4, 5]])


def test_stale_items_are_dropped_counted_and_never_sampled():
  q = QueueSource(capacity=10, items_per_batch=2, max_policy_lag=3)
  for i, version in enumerate([0, 5, 1, 6, 2, 7]):  # out of order, as from several actors
    q.add(_item(i), version)
  assert q.can_sample(4)  # lags 4, -1, 3, -2, 2, -3: item 0 (lag 4 > 3) dropped
  assert q.dropped_stale == 1 and len(q) == 5
  np.testing.assert_array_equal(_ids(q.sample(4)), [[1, 2]])
  # At opt_steps 6, item 4 (version 2, lag 4) is stale too; items 3 and 5 remain.
  np.testing.assert_array_equal(_ids(q.sample(6)), [[3, 5]])
  assert q.dropped_stale == 2 and len(q) == 0
  assert q.metrics()["dropped_stale"] == 2.0


def test_without_a_lag_bound_nothing_is_dropped():
  q = QueueSource(capacity=2, items_per_batch=2)
  q.add(_item(0), version=0)
  q.add(_item(1), version=0)
  np.testing.assert_array_equal(_ids(q.sample(10**6)), [[0, 1]])
  assert q.dropped_stale == 0


def test_policy_lag_metrics_and_their_reset():
  q = QueueSource(capacity=6, items_per_batch=1, updates_per_call=3)
  for i, version in enumerate([2, 4, 9, 10, 10, 10]):
    q.add(_item(i), version)
  q.sample(opt_steps=10)  # lags 8, 6, 1
  assert q.metrics() == {"dropped_stale": 0.0, "policy_lag_min": 1.0,
                         "policy_lag_mean": 5.0, "policy_lag_max": 8.0}
  assert q.metrics() == {"dropped_stale": 0.0}  # nothing sampled since: no lag keys
  q.sample(opt_steps=12)  # lags 2, 2, 2
  assert q.metrics() == {"dropped_stale": 0.0, "policy_lag_min": 2.0,
                         "policy_lag_mean": 2.0, "policy_lag_max": 2.0}


def test_lag_metrics_span_several_samples():
  q = QueueSource(capacity=4, items_per_batch=2)
  for version in [0, 1, 3, 3]:
    q.add(_item(version), version)
  q.sample(2)  # lags 2, 1
  q.sample(4)  # lags 1, 1
  m = q.metrics()
  assert (m["policy_lag_min"], m["policy_lag_mean"], m["policy_lag_max"]) == (1.0, 1.25, 2.0)


def test_capacity_and_back_pressure():
  q = QueueSource(capacity=3, items_per_batch=1, updates_per_call=2)
  assert q.can_insert(3) and not q.can_insert(4)
  for i in range(3):
    q.add(_item(i), version=0)
  assert len(q) == 3 and not q.can_insert() and q.can_insert(0)
  with pytest.raises(ValueError, match="full"):
    q.add(_item(3), version=0)
  assert len(q) == 3
  q.sample(0)  # makes room for two
  assert q.can_insert(2) and not q.can_insert(3)
  q.add(_item(3), version=0)
  np.testing.assert_array_equal(_ids(q.sample(0)), [[2], [3]])


def test_can_sample_only_with_enough_fresh_items():
  q = QueueSource(capacity=4, items_per_batch=2, updates_per_call=2, max_policy_lag=1)
  for i in range(3):
    q.add(_item(i), version=5)
    assert not q.can_sample(5)
  q.add(_item(3), version=5)
  assert q.can_sample(6)
  assert not q.can_sample(7)  # all four now stale (lag 2 > 1), dropped
  assert len(q) == 0 and q.dropped_stale == 4
  with pytest.raises(ValueError, match="can_sample"):
    q.sample(7)


def test_feedback_is_a_no_op():
  q = QueueSource(capacity=1, items_per_batch=1)
  q.add(_item(0), version=0)
  q.feedback(None, np.ones(1))
  assert len(q) == 1


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match="items_per_batch must be >= 1"):
    QueueSource(capacity=4, items_per_batch=0)
  with pytest.raises(ValueError, match="updates_per_call must be >= 1"):
    QueueSource(capacity=4, items_per_batch=1, updates_per_call=0)
  with pytest.raises(ValueError, match=r"2 \* 3 = 6.*raise capacity"):
    QueueSource(capacity=5, items_per_batch=2, updates_per_call=3)
  with pytest.raises(ValueError, match="max_policy_lag"):
    QueueSource(capacity=4, items_per_batch=1, max_policy_lag=-1)
  with pytest.raises(ValueError, match="batch_axis"):
    QueueSource(capacity=4, items_per_batch=1, batch_axis=-1)
  q = QueueSource(capacity=4, items_per_batch=1, batch_axis=1)
  with pytest.raises(ValueError, match="batch_axis 1"):
    q.add({"x": np.zeros((2, 3)), "scalar": np.zeros(2)}, version=0)
  assert len(q) == 0


def test_the_summary_keeps_the_whole_runs_lag_after_metrics_took_its_window():
  """The run's summary is written after its last record: the lag it reports is every sampled
  item's, whether or not a ``metrics`` call just restarted the record's window."""
  q = QueueSource(capacity=6, items_per_batch=1, updates_per_call=3)
  assert q.summary() == {"dropped_stale": 0.0}  # nothing sampled yet: no lag keys
  for i, version in enumerate([2, 4, 9, 10, 10, 10]):
    q.add(_item(i), version)
  q.sample(opt_steps=10)  # lags 8, 6, 1
  q.metrics()  # (a record takes the window)
  q.sample(opt_steps=13)  # lags 3, 3, 3
  q.metrics()
  assert q.summary() == {"dropped_stale": 0.0, "policy_lag_min": 1.0,
                         "policy_lag_mean": 24 / 6, "policy_lag_max": 8.0}
  assert q.summary() == q.summary()  # (reading it changes nothing)
