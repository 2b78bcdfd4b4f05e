"""--track: Weights & Biases gets the scalars TensorBoard gets, the config and the videos,
checked in W&B's offline mode (no network); without wandb installed, one error line naming the
extra."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxasync import experiment
from jaxasync.plot import read_scalars
from jaxasync.train import dqn

from test_config_rerun import _error

FLAGS = ["--mode", "sync", "--no-progress", "--max-opts", "120", "--agent.warmup-period", "100",
         "--eval-interval", "40", "--eval-episodes", "1", "--save-interval", "0",
         "--agent.hidden-sizes", "16", "--agent.batch-size", "32", "--record-interval", "20"]


def wandb_records(path: Path):
  """The protobuf records of an offline W&B run's ``run-<id>.wandb`` (a LevelDB-style log:
  a 7-byte header, then 32 KiB blocks of chunks, each a CRC32, a length, a type and the data;
  a record spans chunks FIRST..MIDDLE..LAST, or is one FULL chunk)."""
  from wandb.proto import wandb_internal_pb2
  block, data = 32 * 1024, path.read_bytes()
  assert data[:4] == b":W&B"
  pos, pending = 7, b""
  while pos + 7 <= len(data):
    left = block - pos % block
    if left < 7:  # (a block's tail too short for a chunk header is padding)
      pos += left
      continue
    _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    if kind == 0:
      pos += left
      continue
    pending += data[pos + 7:pos + 7 + length]
    pos += 7 + length
    if kind in (1, 4):  # FULL, LAST
      yield wandb_internal_pb2.Record.FromString(pending)
      pending = b""


def items(entries) -> dict:
  """``{key: value}`` of a record's items (a key is ``key``, or ``nested_key`` joined by "/")."""
  return {entry.key or "/".join(entry.nested_key): json.loads(entry.value_json)
          for entry in entries}


def test_an_offline_run_holds_the_scalars_the_config_and_the_videos(tmp_path, monkeypatch):
  pytest.importorskip("PIL")  # (GIFs; Pillow is in the test extra)
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  logdir = tmp_path / "run"
  dqn.main(experiment.parse_args(dqn.Args, [*FLAGS, "--logdir", str(logdir), "--track",
                                            "--wandb-project", "tests", "--capture-video", "1"],
                                 None))
  [run_file] = logdir.glob("wandb/offline-run-*/run-*.wandb")
  history, config, files = [], {}, []
  for record in wandb_records(run_file):
    kind = record.WhichOneof("record_type")
    if kind == "history":
      history.append(items(record.history.item))
    elif kind == "run":
      config.update(items(record.run.config.update))
      assert record.run.project == "tests" and record.run.display_name == "run"
    elif kind == "config":
      config.update(items(record.config.update))
    elif kind == "files":
      files += [f.path for f in record.files.files]
  # The scalars: every (name, step, value) TensorBoard got, W&B got, with the step as global_step.
  # (TensorBoard keeps float32s, W&B float64s)
  tensorboard = {(name, step, value) for name, rows in read_scalars(logdir).items()
                 for step, _, value in rows}
  tracked = {(name, row["global_step"], float(np.float32(row[name]))) for row in history
             for name in row if not name.startswith(("_", "global_step", "video"))}
  assert tensorboard and tracked == tensorboard
  assert {"loss", "eval_reward", "env_steps"} <= {name for name, _, _ in tracked}
  # The config: the run's flags as config.json has them, and the script.
  saved = json.loads((logdir / "config.json").read_text())["settings"]
  assert config["algo"] == "dqn" and config["run.max_opts"] == 120
  assert {k: config[k] for k in saved} == saved
  # The videos: one per evaluation (the final params' is the last one's), as files of the run.
  videos = sorted(int(p.stem) for p in (logdir / "videos").iterdir())
  assert videos == [40, 80, 120]
  assert sorted(row["global_step"] for row in history if "video/path" in row) == videos
  assert sum(f.startswith("media/videos/video_") for f in files) == 3, files


def test_without_wandb_the_error_names_the_extra(tmp_path, monkeypatch, capsys):
  monkeypatch.setitem(sys.modules, "wandb", None)  # (import wandb raises ImportError)
  line = _error(dqn, ["--track", "--logdir", str(tmp_path / "run")], capsys)
  assert line == ("error: --track logs to Weights & Biases, and wandb is not installed: "
                  "pip install 'jaxasync[wandb]' (or drop --track).")
  assert not (tmp_path / "run").exists()
