"""``--track``: a run's scalars, config and videos sent to Weights & Biases beside TensorBoard.

The scalars are the recorder's (``WandbRecorder`` sits in the run's ``MultiRecorder`` next to
``TensorboardRecorder``), so W&B gets every value TensorBoard gets, at the same step. That step
is logged as ``global_step`` and declared the x-axis of every metric rather than passed as W&B's
own ``step``: the learner and the evaluation thread record at steps that interleave, and W&B
drops a ``step`` lower than one already logged. The W&B run lives in ``<logdir>/wandb``;
``WANDB_MODE=offline`` keeps it there (``wandb sync`` uploads it later).

wandb is an optional extra (``pip install 'jaxasync[wandb]'``), imported only by ``--track``.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Mapping

from jaxasync.errors import ConfigError

INSTALL = "pip install 'jaxasync[wandb]'"
STEP = "global_step"  # the x-axis of every metric: the step the recorder was given


def import_wandb() -> Any:
  """The ``wandb`` module; ``ConfigError`` naming the extra when it is not installed."""
  try:
    import wandb
  except ImportError:
    raise ConfigError(f"--track logs to Weights & Biases, and wandb is not installed: "
                      f"{INSTALL} (or drop --track).") from None
  return wandb


class WandbRecorder:
  """Mirrors each record to a W&B run, with its step as ``global_step``. ``close`` leaves the
  run open (the trainer closes its recorders before the final videos are logged);
  ``finish`` ends it."""

  def __init__(self, run: Any):
    self.run = run
    run.define_metric(STEP)
    run.define_metric("*", step_metric=STEP)
    self._lock = threading.Lock()  # the learner and the evaluation thread both record

  def record(self, step: int, values: Mapping[str, float]) -> None:
    with self._lock:
      self.run.log({**{k: float(v) for k, v in values.items()}, STEP: step})

  def text(self, tag: str, text: str, step: int = 0) -> None:
    """The newest line under ``tag``, in the run's summary (W&B charts numbers only)."""
    with self._lock:
      self.run.summary[tag] = text

  def videos(self, paths: list[Path]) -> None:
    """Logs the run's video files (``<logdir>/videos/<opt_steps>.gif``), each once, as
    ``video`` at its SGD step."""
    wandb = import_wandb()
    with self._lock:
      for path in dict.fromkeys(map(Path, paths)):  # (the final params' may repeat the last)
        entry = {"video": wandb.Video(str(path), format=path.suffix[1:])}
        if path.stem.isdigit():
          entry[STEP] = int(path.stem)
        self.run.log(entry)

  def close(self) -> None:
    pass

  def finish(self, failed: bool = False) -> None:
    """Ends the W&B run and waits until it is on disk: ``run.finish`` can return before
    wandb's service has written the run's records (an offline run read back at once then held
    its header only, one time in four here); ``wandb.teardown`` flushes and stops that service
    (the next ``wandb.init`` starts another)."""
    with self._lock:
      self.run.finish(exit_code=1 if failed else 0)
      import_wandb().teardown()


def start(logdir: str | os.PathLike, config: dict, project: str, entity: str | None
          ) -> WandbRecorder:
  """A W&B run named after ``logdir`` (its directory under ``<logdir>/wandb``) with
  ``config`` (the run's flags, dotted as in config.json), as a recorder."""
  wandb = import_wandb()
  try:
    run = wandb.init(project=project, entity=entity, name=Path(logdir).name, dir=str(logdir),
                     config=config)
  except Exception as e:  # (no login, no network, a refused project: wandb's own errors)
    raise ConfigError(f"--track could not start a W&B run ({type(e).__name__}: {e}); run "
                      "`wandb login`, set WANDB_MODE=offline, or drop --track.") from None
  return WandbRecorder(run)
