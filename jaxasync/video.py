"""Episodes of a policy as videos: ``record_episodes`` (frames from one ``render_mode="rgb_array"``
env, never a training vector env), ``write_video`` (GIF through Pillow, MP4 through imageio's
ffmpeg: ``pip install 'jaxasync[video]'``) and ``VideoHook``, which records the current
params every few evaluations of a run, in a thread of its own so the learner never waits
(``--capture-video``; ``python -m jaxasync.enjoy --video`` records a saved run)."""

from __future__ import annotations

import os
import queue
import threading
from pathlib import Path
from typing import Any

import numpy as np

from jaxasync.agent import ActorContext, Agent
from jaxasync.errors import ConfigError
from jaxasync.faults import logger
from jaxasync.param_store import host_copy, to_cpu


def video_suffix() -> str:
  """'.mp4' when imageio and its ffmpeg are installed (the video extra), else '.gif'."""
  try:
    import imageio_ffmpeg  # noqa: F401
    import imageio.v2  # noqa: F401
  except ImportError:
    return ".gif"
  return ".mp4"


def check_writer() -> None:
  """Raises ``ConfigError`` when no video can be written (neither imageio's ffmpeg nor Pillow)."""
  if video_suffix() == ".gif":
    try:
      import PIL  # noqa: F401
    except ImportError:
      raise ConfigError("capture_video writes GIFs through Pillow or MP4s through imageio's "
                        "ffmpeg, and neither is installed: pip install 'jaxasync[video]'.") from None


def check_renders(env_id: str) -> None:
  """Raises ``ConfigError`` unless ``gym.make(env_id, render_mode="rgb_array")`` renders RGB
  frames (``uint8 [H, W, 3]``)."""
  import gymnasium as gym
  try:
    env = gym.make(env_id, render_mode="rgb_array")
    try:
      env.reset(seed=0)
      frame = np.asarray(env.render())
    finally:
      env.close()
  except Exception as e:
    raise ConfigError(f"capture_video records {env_id!r} through gym.make(env_id, "
                      f"render_mode='rgb_array'), which failed ({type(e).__name__}: {e}); "
                      "turn capture_video off for this env.") from None
  if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3 or min(frame.shape[:2]) < 8:
    raise ConfigError(f"capture_video needs {env_id!r} to render RGB images (uint8 [H, W, 3]); "
                      f"its render() gives {frame.dtype} {frame.shape}. Turn capture_video off "
                      "for this env.")


def record_episodes(agent: Agent, params: Any, env_id: str, episodes: int, seed: int
                    ) -> tuple[list[np.ndarray], list[float]]:
  """Frames and returns of ``episodes`` episodes of the evaluation policy on one
  ``gym.make(env_id, render_mode="rgb_array")``."""
  import gymnasium as gym
  env = gym.make(env_id, render_mode="rgb_array")
  rng = np.random.default_rng(seed)
  params = to_cpu(params)
  frames, returns = [], []
  try:
    for k in range(episodes):
      obs, _ = env.reset(seed=seed + k)
      actor_state = agent.initial_actor_state(ActorContext(num_envs=1, evaluation=True))
      total, done = 0.0, False
      frames.append(env.render())
      while not done:
        action, _, actor_state = agent.act(params, obs[None], actor_state, rng, explore=False)
        obs, reward, terminated, truncated, _ = env.step(action[0])
        total += float(reward)
        done = terminated or truncated
        frames.append(env.render())
      returns.append(total)
  finally:
    env.close()
  return frames, returns


def gif_bytes(frames: list[np.ndarray], fps: int) -> bytes:
  """``frames`` (``[H, W, 3]`` uint8) as an animated GIF, looping (Pillow)."""
  import io

  from PIL import Image
  images = [Image.fromarray(f) for f in frames]
  out = io.BytesIO()
  images[0].save(out, format="GIF", save_all=True, append_images=images[1:], loop=0,
                 duration=max(1, round(1000 / fps)))
  return out.getvalue()


def write_video(path: str | os.PathLike, frames: list[np.ndarray], fps: int) -> Path:
  """Writes ``frames`` (``[H, W, 3]`` uint8) as a GIF (Pillow) or MP4 (imageio + ffmpeg),
  into a temporary file renamed into place when whole."""
  path = Path(path)
  suffix = path.suffix.lower()
  if suffix not in (".gif", ".mp4"):
    raise ConfigError(f"video {path}: name a .gif or .mp4 file.")
  tmp = path.with_name(f".{path.name}.tmp{suffix}")
  try:
    if suffix == ".gif":
      tmp.write_bytes(gif_bytes(frames, fps))
    else:
      import imageio.v2 as imageio
      imageio.mimsave(tmp, frames, fps=fps)
  except ImportError as e:
    raise ConfigError(f"video {path} needs {e.name}: pip install 'jaxasync[video]'.") from None
  except Exception:
    tmp.unlink(missing_ok=True)
    raise
  os.replace(tmp, path)
  return path


class VideoHook:
  """``Hook`` function: one episode of the current params to ``<directory>/<opt_steps>.<ext>``
  per call, recorded and written by one background thread (the learner hands over a host
  copy of the params and goes on). A recording that fails is logged and kept, and the others
  go on; ``close`` waits for those in flight and raises the first failure. The thread is a
  daemon: a process that must exit never waits for an episode being recorded.

  Args:
    agent: the learner's agent (its ``act`` on a single env).
    env_id: the env to record (the evaluation env's id).
    directory: where the videos go (created).
    fps: frames per second.
    seed: the recorded episodes' reset seed (the same start for every video of a run).
    tensorboard: a ``TensorboardRecorder`` that also gets each video (``video``); None: files
      only.
  """

  def __init__(self, agent: Agent, env_id: str, directory: str | os.PathLike, fps: int = 30,
               seed: int = 0, tensorboard: Any = None):
    self.agent, self.env_id, self.fps, self.seed = agent, env_id, fps, seed
    self.tensorboard = tensorboard
    self.directory = Path(directory)
    self.directory.mkdir(parents=True, exist_ok=True)
    self.suffix = video_suffix()
    self.written: list[Path] = []
    self.error: BaseException | None = None
    self._jobs: queue.Queue = queue.Queue()
    self._thread = threading.Thread(target=self._work, name="video", daemon=True)
    self._thread.start()

  def __call__(self, loop) -> None:
    self.submit(loop.learner.evaluation_params(), loop.learner.opt_steps)

  def submit(self, params: Any, opt_steps: int) -> None:
    """Records ``params`` (copied to the host now) as ``<opt_steps>.<ext>``, in the background."""
    self._jobs.put((host_copy(params), opt_steps))

  def _work(self) -> None:
    while True:
      job = self._jobs.get()
      try:
        if job is None:
          return
        params, opt_steps = job
        frames, _ = record_episodes(self.agent, params, self.env_id, 1, self.seed)
        self.written.append(write_video(self.directory / f"{opt_steps}{self.suffix}", frames,
                                        self.fps))
        if self.tensorboard is not None:
          try:  # (the file is the video; TensorBoard's copy must not fail the run)
            self.tensorboard.video("eval/video", frames, opt_steps, self.fps)
          except Exception as e:
            logger.warning(f"the video of SGD step {opt_steps} did not reach TensorBoard "
                           f"({type(e).__name__}: {e})")
      except Exception as e:  # kept for close(); the run goes on
        logger.warning(f"the video of SGD step {job[1]} could not be recorded "
                       f"({type(e).__name__}: {e})")
        if self.error is None:
          self.error = e
      finally:
        self._jobs.task_done()

  def close(self, wait: bool = True) -> None:
    """Ends the recording thread; with ``wait``, after the videos in flight, then raises the
    first failure (without: drops what is queued, for a run that is ending on an error)."""
    if not wait:
      self.tensorboard = None  # (a recording still running must not reopen the closed writer)
      while True:
        try:
          self._jobs.get_nowait()
          self._jobs.task_done()
        except queue.Empty:
          break
    self._jobs.put(None)
    if wait:
      self._thread.join()
      if self.error is not None:
        raise self.error
