"""Recorders: where scalars go. Every recorded value reaches its sink (none is dropped)."""

from __future__ import annotations

import math
import sys
import threading
from typing import Mapping, Protocol, Sequence, TextIO

import numpy as np


class Recorder(Protocol):
  """Something that takes ``{name: scalar}`` records at a step, and lines of text."""

  def record(self, step: int, values: Mapping[str, float]) -> None: ...

  def text(self, tag: str, text: str, step: int = 0) -> None:
    """One line under ``tag`` at ``step`` (the run's bottleneck verdict, hyperparameters)."""

  def close(self) -> None: ...


class NullRecorder:
  """Discards everything."""

  def record(self, step: int, values: Mapping[str, float]) -> None:
    pass

  def text(self, tag: str, text: str, step: int = 0) -> None:
    pass

  def close(self) -> None:
    pass


class MemoryRecorder:
  """Keeps every record in ``self.records`` as ``(step, {name: value})``, and every text in
  ``self.texts`` as ``(step, tag, text)`` (tests, notebooks)."""

  def __init__(self):
    self.records: list[tuple[int, dict[str, float]]] = []
    self.texts: list[tuple[int, str, str]] = []
    self._lock = threading.Lock()

  def record(self, step: int, values: Mapping[str, float]) -> None:
    with self._lock:
      self.records.append((step, {k: float(v) for k, v in values.items()}))

  def text(self, tag: str, text: str, step: int = 0) -> None:
    with self._lock:
      self.texts.append((step, tag, text))

  def series(self, name: str) -> list[tuple[int, float]]:
    """``[(step, value)]`` for one scalar name."""
    return [(s, v[name]) for s, v in self.records if name in v]

  def close(self) -> None:
    pass


class TensorboardRecorder:
  """Writes every scalar to a tensorboardX event file under ``logdir``."""

  def __init__(self, logdir: str, flush_secs: int = 10):
    from tensorboardX import SummaryWriter  # imported here: optional for users of other sinks
    self._writer = SummaryWriter(logdir, flush_secs=flush_secs)
    self._lock = threading.Lock()  # the learner and the evaluation thread both record

  def record(self, step: int, values: Mapping[str, float]) -> None:
    with self._lock:
      for name, value in values.items():
        self._writer.add_scalar(name, float(value), step)

  def text(self, tag: str, text: str, step: int = 0) -> None:
    """Markdown ``text`` in TensorBoard's text tab (a run's hyperparameters)."""
    with self._lock:
      self._writer.add_text(tag, text, step)

  def video(self, tag: str, frames: Sequence[np.ndarray], step: int, fps: int) -> None:
    """An episode's ``frames`` (``[H, W, 3]`` uint8) as an animated GIF under ``tag`` in
    TensorBoard's Images tab: tensorboardX's ``add_video`` needs moviepy to encode, and
    TensorBoard shows a GIF-encoded image summary as the animation it is."""
    from tensorboardX.proto.summary_pb2 import Summary

    from jaxasync.video import gif_bytes
    height, width = frames[0].shape[:2]
    image = Summary.Image(height=height, width=width, colorspace=3,
                          encoded_image_string=gif_bytes(list(frames), fps))
    with self._lock:
      self._writer._get_file_writer().add_summary(
          Summary(value=[Summary.Value(tag=tag, image=image)]), step)

  def close(self) -> None:
    with self._lock:
      self._writer.flush()
      self._writer.close()


class ConsoleRecorder:
  """Prints the listed keys (all when ``keys`` is None) on one line per record."""

  def __init__(self, keys: tuple[str, ...] | None = None, stream: TextIO | None = None):
    self._keys, self._stream = keys, stream or sys.stdout

  def record(self, step: int, values: Mapping[str, float]) -> None:
    keys = self._keys or tuple(values)
    shown = [f"{k}={_fmt(values[k])}" for k in keys if k in values]
    if shown:
      print(f"[{step}] " + " ".join(shown), file=self._stream, flush=True)

  def text(self, tag: str, text: str, step: int = 0) -> None:
    pass  # (the console gets the run's last verdict at its end, not one per record)

  def close(self) -> None:
    pass


class MultiRecorder:
  """Fans each record out to several recorders."""

  def __init__(self, *recorders: Recorder):
    self.recorders = recorders

  def record(self, step: int, values: Mapping[str, float]) -> None:
    for r in self.recorders:
      r.record(step, values)

  def text(self, tag: str, text: str, step: int = 0) -> None:
    for r in self.recorders:
      r.text(tag, text, step)

  def close(self) -> None:
    for r in self.recorders:
      r.close()


def _fmt(v: float) -> str:
  v = float(v)
  if math.isfinite(v) and v == int(v) and abs(v) < 1e12:
    return str(int(v))
  return f"{v:.4g}"
