"""The errors a run ends with, each carrying one line that names the problem and the fix:
bad input (``ConfigError``) and the four ways a started run fails. ``jaxasync.experiment.run_cli``
turns each into one ``error: ...`` line (exit 2 for bad input, 1 for a failed run)."""

from __future__ import annotations

from typing import Any, Sequence


class ConfigError(ValueError):
  """Bad user input: the message names the problem and the fix."""


def check_positive(config: Any, names: Sequence[str]) -> None:
  """Raises ``ConfigError`` unless each of ``config``'s fields ``names`` (step sizes, loss
  thresholds and the like) is a finite number > 0."""
  for name in names:
    value = getattr(config, name)
    if not 0.0 < value < float("inf"):  # (also refuses NaN)
      raise ConfigError(f"{name} must be a finite number > 0, got {value}.")


class NonFiniteError(RuntimeError):
  """The loss, a priority or the params became NaN or infinite: training diverged."""


class StallError(RuntimeError):
  """The run made no progress for ``stall_timeout`` seconds; the message names the stage."""


class ActorFailed(RuntimeError):
  """An actor raised more often than ``max_restarts`` allows; carries its traceback."""


class CheckpointError(RuntimeError):
  """A checkpoint could not be written (disk full, permissions gone): the message names the
  path, the OS's reason and the last complete checkpoint, which is untouched."""
