"""The multi-device learner: ``multidevice_checks.py`` in its own process on 4 forced CPU
devices (XLA_FLAGS must be set before JAX starts, never flipped inside this session), and what
this one-device session can check itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import pytest

import jaxasync as ja
from jaxasync.sharding import learner_devices

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_multidevice_checks_on_four_forced_cpu_devices():
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
         "JAX_PLATFORMS": "cpu"}
  out = subprocess.run([sys.executable, "-m", "pytest", "tests/multidevice_checks.py", "-q",
                        "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  tail = out.stdout[-4000:] + out.stderr[-2000:]
  assert out.returncode == 0, tail
  passed = re.search(r"(\d+) passed", out.stdout)
  assert passed and int(passed.group(1)) >= 16 and "failed" not in out.stdout, tail


def test_more_learner_devices_than_there_are_is_refused_with_the_fix():
  assert len(jax.devices()) == 1  # (this session: the CPU, not split)
  with pytest.raises(ja.ConfigError, match=r"learner_devices=2 but this process sees 1 cpu.*"
                                           r"xla_force_host_platform_device_count"):
    learner_devices(2)
  with pytest.raises(ja.ConfigError, match="must be >= 1"):
    learner_devices(0)
  assert learner_devices(None) == jax.devices()[:1]


def test_no_deprecated_multi_device_api_is_used():
  """pmap, device_put_sharded and device_put_replicated are deprecated in JAX 0.10: the
  package, experiments and scripts use jax.sharding instead."""
  pattern = re.compile(r"\b(pmap|device_put_sharded|device_put_replicated)\s*\(")
  hits = [f"{path}:{n}" for folder in ("jaxasync", "experiments", "scripts")
          for path in sorted((REPO / folder).rglob("*.py"))
          for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
  assert not hits, hits
