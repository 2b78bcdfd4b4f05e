"""The throughput harness runs end to end on a tiny budget and writes every figure (no timing checks)."""

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_throughput.py"


def test_bench_throughput_writes_every_figure(tmp_path):
  out = tmp_path / "bench.json"
  proc = subprocess.run(
      [sys.executable, str(SCRIPT), "--duration", "1", "--warmup", "0.3", "--repeats", "1",
       "--variants", "actor", "learner", "sync", "thread", "--solve-seeds", "0",
       "--json", str(out)],
      capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "overlap" in proc.stdout  # the table was printed
  result = json.loads(out.read_text())

  med = result["medians"]
  # (actor_sync: the actor with the sync loop's 4 sub-envs, beside the 8 of --envs-per-actor)
  assert set(med) == {"actor", "bare", "actor_sync", "learner", "pure", "sync", "thread"}
  assert med["actor"]["num_envs"] == 8 and med["actor_sync"]["num_envs"] == 4
  for name in ("actor", "bare", "actor_sync", "sync", "thread"):
    assert med[name]["env_steps_per_sec"] > 0, name
  for name in ("learner", "pure", "sync", "thread"):
    assert med[name]["opt_steps_per_sec"] > 0, name
  for name in ("sync", "thread"):
    assert med[name]["samples_per_sec"] > 0
    assert med[name]["window_s"] > 0
    assert "update" in med[name]["stage_fractions"]
    assert med[name]["summary_opt_steps_per_sec"] > 0
  assert "ingest" in med["thread"]["stage_fractions"]

  for key in ("actor_over_bare", "learner_over_pure"):
    assert math.isfinite(result["ratios"][key]) and result["ratios"][key] > 0
  overlap = result["overlap_efficiency"]
  assert set(overlap) == {"sync", "sync_own_actor", "thread"}
  assert all(v > 0 for v in overlap.values())
  sync, learner = med["sync"], med["learner"]["opt_steps_per_sec"]
  assert overlap["sync_own_actor"] == pytest.approx(
      sync["env_steps_per_sec"] / med["actor_sync"]["env_steps_per_sec"]
      + sync["opt_steps_per_sec"] / learner)

  assert all(len(runs) == 1 for runs in result["repeats"].values())
  assert result["config"]["args"]["duration"] == 1
  assert result["config"]["agent"]["batch_size"] == 128
  assert result["machine"]["cpu_count"] >= 1 and result["machine"]["jax_backend"]
  assert result["solve"] == {}


def test_bench_atari_measures_every_backend(tmp_path):
  out = tmp_path / "atari.json"
  proc = subprocess.run(
      [sys.executable, str(SCRIPT.parent / "bench_atari.py"), "--duration", "0.3",
       "--warmup", "0.1", "--repeats", "2", "--num-envs", "2", "--json", str(out)],
      capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "vs gymnasium" in proc.stdout
  result = json.loads(out.read_text())
  assert set(result["agent_steps_per_sec"]) == {"gymnasium", "ale_vector", "envpool"}
  for backend, rate in result["agent_steps_per_sec"].items():
    assert rate > 0 and len(result["repeats"][backend]) == 2
    assert result["frames_per_sec"][backend] == 4 * rate  # frame skip 4
  assert result["ratio_to_gymnasium"]["gymnasium"] == 1.0


def test_bench_sync_params_times_each_way(tmp_path):
  """scripts/bench_sync_params.py: each variant's rate and per-step times; the copy variants
  time a copy per adoption, 'as-published' none (on this CPU learner the params are already
  where the actor acts)."""
  out = tmp_path / "sync.json"
  proc = subprocess.run(
      [sys.executable, str(SCRIPT.parent / "bench_sync_params.py"), "--duration", "1",
       "--warmup", "0.3", "--json", str(out)], capture_output=True, text=True, timeout=180)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  results = json.loads(out.read_text())["results"]
  assert set(results) == {"copy", "device-get", "as-published"}
  for variant, r in results.items():
    assert r["env_steps_per_sec"] > 0, variant
    assert r["us_per_vector_step"]["take"] > 0 and r["us_per_vector_step"]["choose"] > 0
  assert results["device-get"]["us_per_vector_step"]["adopt"] > 0
  assert results["as-published"]["us_per_vector_step"]["adopt"] == 0


def _harness():
  sys.path.insert(0, str(SCRIPT.parent))
  import bench_throughput
  return bench_throughput


def test_cores_used_per_kind_between_two_snapshots():
  bt = _harness()
  a = {"t": 10.0, "machine": 100.0, "per_pid": {1: 5.0, 2: 3.0, 9: 1.0},
       "kinds": {1: "learner", 2: "actors", 9: "actors"}}
  # Over 2 s: the learner 1.8 CPU s, actor 2 1.6, actor 9 gone, a Ray daemon started (0.4);
  # the machine was busy 4.5 CPU s in all, so 0.7 s were other load.
  z = {"t": 12.0, "machine": 104.5, "per_pid": {1: 6.8, 2: 4.6, 3: 0.4},
       "kinds": {1: "learner", 2: "actors", 3: "ray_daemons"}}
  used = bt.cpu_cores_used(a, z)
  assert used == {"learner": pytest.approx(0.9), "actors": pytest.approx(0.8),
                  "ray_workers": 0.0, "ray_daemons": pytest.approx(0.2),
                  "rest": pytest.approx(0.35)}


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads /proc")
def test_a_busy_child_process_is_counted_as_an_actor():
  bt = _harness()
  child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\n"
                            "while time.time() - t < 30: pass"])
  try:
    time.sleep(0.5)
    a = bt.cpu_snapshot()
    time.sleep(1.0)
    z = bt.cpu_snapshot()
  finally:
    child.kill()
    child.wait()
  assert a["kinds"][os.getpid()] == "learner" and z["kinds"][child.pid] == "actors"
  used = bt.cpu_cores_used(a, z)
  assert used["actors"] > used["learner"]  # (the child spun while this process slept)
  assert used["ray_workers"] == used["ray_daemons"] == 0.0
