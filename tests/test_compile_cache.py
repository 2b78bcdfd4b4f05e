"""The persistent compilation cache a run keeps its compiled programs in
(``experiment.use_compile_cache``, ``--compile-cache``) and hands to its process actors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import tyro
from jax.experimental.compilation_cache import compilation_cache

from jaxasync import experiment
from jaxasync.actor_manager import actor_process_environ

import dqn  # experiments/dqn.py (experiments/ is on pytest's pythonpath)

CACHE_KEYS = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")


@pytest.fixture(autouse=True)
def jax_cache_settings(monkeypatch):
  """No cache directory from the environment; JAX's cache settings put back afterwards."""
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
  saved = {name: getattr(jax.config, name) for name in names}
  yield
  compilation_cache.reset_cache()
  for name, value in saved.items():
    jax.config.update(name, value)


def test_a_program_compiled_once_is_loaded_from_the_cache_the_next_time(tmp_path):
  hits = []
  def listener(event, **kwargs):
    if event == "/jax/compilation_cache/cache_hits":
      hits.append(event)
  where = experiment.use_compile_cache(str(tmp_path / "xla"))
  assert where == str(tmp_path / "xla") == jax.config.jax_compilation_cache_dir
  program = jax.jit(lambda x: jnp.tanh(x) * 1.75 + 0.5)  # compiles in milliseconds
  x = jnp.arange(13.0)
  expected = program(x)
  entries = [p.name for p in (tmp_path / "xla").iterdir() if p.name.endswith("-cache")]
  assert entries  # kept, however quickly it compiled
  jax.clear_caches()  # (the in-memory ones: the next call looks in the directory)
  jax.monitoring.register_event_listener(listener)
  try:
    again = program(x)
  finally:
    jax.monitoring.unregister_event_listener(listener)
  assert len(hits) == 1
  assert jnp.array_equal(again, expected)


def test_a_later_run_in_the_same_process_moves_to_its_own_directory(tmp_path):
  experiment.use_compile_cache(str(tmp_path / "a"))
  jax.jit(lambda x: x * 2.5 - 1.0)(jnp.ones(7)).block_until_ready()
  experiment.use_compile_cache(str(tmp_path / "b"))
  jax.jit(lambda x: x * 3.5 - 2.0)(jnp.ones(7)).block_until_ready()
  assert any(p.name.endswith("-cache") for p in (tmp_path / "b").iterdir())


def test_a_relative_directory_is_made_absolute(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert experiment.use_compile_cache("xla") == str(tmp_path / "xla")
  assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xla")


def test_none_turns_it_off_and_the_environment_variable_wins(tmp_path, monkeypatch):
  assert experiment.use_compile_cache(None) is None
  assert jax.config.jax_compilation_cache_dir is None
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "env"))
  assert experiment.use_compile_cache("~/elsewhere") == str(tmp_path / "env")
  assert jax.config.jax_compilation_cache_dir == str(tmp_path / "env")
  # (the environment's cache keeps JAX's settings: the minimum compile time is not touched)
  assert jax.config.jax_persistent_cache_min_compile_time_secs == 1.0


def test_process_actors_get_the_learners_cache(tmp_path):
  experiment.use_compile_cache(str(tmp_path / "xla"))
  env = actor_process_environ()
  assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "xla")
  assert float(env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]) == (
      experiment.COMPILE_CACHE_MIN_SECS)
  assert env["JAX_PLATFORMS"] == "cpu"
  experiment.use_compile_cache(None)
  assert not set(CACHE_KEYS) & set(actor_process_environ())


def test_a_run_fills_its_cache_and_a_resume_may_name_another(tmp_path, capsys):
  flags = ["--mode", "sync", "--no-progress", "--agent.warmup-period", "200",
           "--eval-interval", "0", "--save-interval", "100", "--agent.hidden-sizes", "16",
           "--logdir", str(tmp_path / "run")]
  dqn.main(tyro.cli(dqn.Args, args=[*flags, "--max-opts", "100",
                                    "--compile-cache", str(tmp_path / "a")]))
  assert any(p.name.startswith("jit__update") for p in (tmp_path / "a").iterdir())
  capsys.readouterr()
  summary = dqn.main(tyro.cli(dqn.Args, args=[*flags, "--max-opts", "200", "--resume",
                                              "--compile-cache", str(tmp_path / "b")]))
  assert summary["opt_steps"] == 200
  assert "compile" not in capsys.readouterr().out  # neither refused nor listed as a change
