"""PyTorch state as one checkpoint: model + optimizer + every rank's RNG states + data position.

Used by the built-in PyTorch workload and by scripts through the rank API (``rank.checkpoint``
hands a directory; ``save(directory, ...)`` writes into it). Rank 0 writes the model and optimizer
(identical on every data-parallel rank); every rank writes its own RNG states (dropout and data
augmentation draw from them), so a resumed run draws what the uninterrupted one drew.
"""

from __future__ import annotations

import io
import random
import threading
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Iterator, cast

import torch
import torch.distributed as dist

from experiments.runtime.sink import FileSink

MODEL_FILE = "model.pt"
FORMAT = f"torch.save (pickle+zip), torch {torch.__version__}"

if TYPE_CHECKING:
    import numpy as np


def rng_file(rank: int) -> str:
    return f"rng-rank{rank:05d}.pt"


def save(target: Path | FileSink, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, *, rank: int,
         step: int, data_position: Any = None, extra: dict[str, Any] | None = None) -> None:
    """Write this rank's share of the state after ``step`` into ``target`` (a directory or a sink),
    now: from the tensors themselves (no copy; the caller's training waits for it)."""
    _capture(target, model, optimizer, rank=rank, step=step, data_position=data_position, extra=extra,
             copy=_as_is)()


def snapshot(target: Path | FileSink, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, *,
             rank: int, step: int, data_position: Any = None, extra: dict[str, Any] | None = None,
             staging: "StagingBuffers | None" = None) -> Callable[[], None]:
    """``save`` in two parts: a copy of this rank's share now (every tensor copied, into ``staging``'s
    buffers if given: training may go on), and the returned call, which writes the copy into
    ``target`` (on any thread). With ``staging``, call the next snapshot only after this write ended."""
    return _capture(target, model, optimizer, rank=rank, step=step, data_position=data_position, extra=extra,
                    copy=staging.copy if staging is not None else _fresh_copy)


def _capture(target: Path | FileSink, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, *,
             rank: int, step: int, data_position: Any, extra: dict[str, Any] | None,
             copy: Callable[[tuple[Any, ...], torch.Tensor], torch.Tensor]) -> Callable[[], None]:
    """This rank's share, each tensor taken through ``copy``, and the call that writes it."""
    files: dict[str, Any] = {}
    if rank == 0:
        files[MODEL_FILE] = _copied({
            "model": model.state_dict(), "optimizer": optimizer.state_dict() if optimizer else None,
            "step": step, "data_position": step if data_position is None else data_position, **(extra or {})},
            copy, ())
    files[rng_file(rank)] = rng_state()  # fresh objects already

    def write() -> None:
        for name, state in files.items():
            with _open(target, name) as handle, _without_crc():
                torch.save(state, handle)

    return write


@contextmanager
def _without_crc() -> Iterator[None]:
    """torch.save without the CRC-32 of every record: about half of its time for a large state
    (measured: 8 ms of 18 at 16 MiB), and torch.load never checks it (a flipped byte loads); the
    checkpoint's manifest hash is what is checked. The setting is torch's global one: off while any
    of this module's saves runs (counted, so that overlapping saves on several threads put it back
    only when the last ends), then as it was (another thread's own torch.save in that moment is
    written without it too, and loads the same). A torch without the setting saves as it always did."""
    global _crc_off_count, _crc_saved
    config = _serialization_config()
    if config is None:
        yield
        return
    with _crc_lock:
        if _crc_off_count == 0:
            _crc_saved = config.save.compute_crc32
            config.save.compute_crc32 = False
        _crc_off_count += 1
    try:
        yield
    finally:
        with _crc_lock:
            _crc_off_count -= 1
            if _crc_off_count == 0:
                config.save.compute_crc32 = _crc_saved


_crc_lock = threading.Lock()
_crc_off_count = 0
_crc_saved: Any = True


def _serialization_config() -> Any:
    """torch's serialization settings, where this torch has the CRC switch (2.6 on)."""
    try:
        from torch.utils.serialization import config
    except ImportError:
        return None
    try:
        config.save.compute_crc32  # noqa: B018 - does this torch have it
    except AttributeError:
        return None
    return config


class StagingBuffers:
    """Host copies of a state's tensors, reused from one snapshot to the next: a capture is then a
    copy into memory already touched (no page faults), as asynchronous checkpointing does elsewhere.
    Safe because a rank's next snapshot waits for its previous write (RankSession)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}

    def copy(self, where: tuple[Any, ...], tensor: torch.Tensor) -> torch.Tensor:
        buffer = self._buffers.get(where)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype)
            self._buffers[where] = buffer
        return buffer.copy_(tensor.detach())


def _fresh_copy(where: tuple[Any, ...], tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().clone()


def _as_is(where: tuple[Any, ...], tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach()


def _copied(value: Any, copy: Callable[[tuple[Any, ...], torch.Tensor], torch.Tensor], where: tuple[Any, ...]) -> Any:
    """``value`` with every tensor in it copied (dicts, lists and tuples rebuilt around them)."""
    if isinstance(value, torch.Tensor):
        return copy(where, value)
    if isinstance(value, dict):
        return {key: _copied(item, copy, (*where, key)) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copied(item, copy, (*where, index)) for index, item in enumerate(value))
    return value


def load(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, *, rank: int,
         step: int | None = None) -> dict[str, Any]:
    """Restore what ``save`` wrote; returns the saved state (``data_position``, ``step``, extras)."""
    state = load_file(directory / MODEL_FILE)
    if step is not None and state["step"] != step:
        raise ValueError(f"{directory / MODEL_FILE} holds step {state['step']}, expected {step}")
    model.load_state_dict(state["model"])
    if optimizer is not None and state.get("optimizer") is not None:
        optimizer.load_state_dict(state["optimizer"])
    path = directory / rng_file(rank)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no RNG state for rank {rank} (was the checkpoint written with another "
                                "world size?)")
    set_rng_state(load_file(path))
    return state


@contextmanager
def _open(target: Path | FileSink, name: str) -> Iterator[BinaryIO]:
    if isinstance(target, FileSink):
        with target.open(name) as handle:
            yield handle
    else:
        with open(target / name, "wb") as handle:
            yield handle


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    try:  # torch does not need NumPy: a training environment without it has no NumPy state to keep
        import numpy as np
    except ImportError:
        return state
    # numpy's state as plain tensors/ints so the file loads with weights_only=True (no pickle code).
    # numpy 1.x's stubs type get_state() as its dict form; called so, it returns the legacy tuple.
    _, key, pos, has_gauss, cached = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
    state["numpy"] = {"key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    saved = state.get("numpy")
    if saved is None:  # saved where NumPy was not there
        return
    import numpy as np

    key = saved["key"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", key, saved["pos"], saved["has_gauss"], saved["cached_gaussian"]))


def load_file(path: Path) -> Any:
    # Read fully first: one sequential read, and weights_only refuses arbitrary pickled code.
    return torch.load(io.BytesIO(path.read_bytes()), weights_only=True)


class TorchCollectives:
    """The rank API's collectives over torch.distributed (after init_process_group), instead of
    files: ``api.init(collectives=TorchCollectives())`` once the process group exists. ``group``
    None: a gloo group whose timeout is ``patience_s`` (ranks wait there while rank 0 hashes)."""

    def __init__(self, patience_s: float = 300.0) -> None:
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=patience_s))

    def barrier(self, timeout_s: float | None = None) -> None:
        dist.barrier(group=self.group)

    def broadcast_int(self, value: int, timeout_s: float | None = None) -> int:
        tensor = torch.tensor([value], dtype=torch.int64)
        dist.broadcast(tensor, src=0, group=self.group)
        return int(tensor.item())
