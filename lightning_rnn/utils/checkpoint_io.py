"""Checkpoint files that are replaced in one step, so that no failure leaves a partial one.

Lightning's ``TorchCheckpointIO`` serializes a checkpoint into memory and writes it through an
fsspec transaction, which for a local path writes a temporary file in the system's temporary
directory and moves it over the target. Where that directory is on another filesystem than the
checkpoints (a node-local ``/tmp`` and a shared run directory, as on most clusters), the move is
a copy into the target file itself: a process killed or out of space during it leaves a
truncated ``last.ckpt`` in place of the good one, and the temporary directory must hold a
whole checkpoint. The file is not flushed to disk either, so a crash of the machine can lose it.
"""
from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Any

import torch
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

TEMPORARY_SUFFIX = ".tmp"


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` whose local saves write a temporary file next to the
    target (``.NAME.UNIQUE.tmp``, in the same directory, so on the same filesystem), flush it to
    disk and rename it over the target: the target is the previous checkpoint or the new one,
    whole, whatever happens during the save. A failed save removes its temporary file; one left
    by a killed process is removed by the next save of the same target. Remote paths (``s3://``
    and the like) are saved as Lightning saves them.

    Example::

        Trainer(plugins=[AtomicCheckpointIO()])  # the command line's train task uses it
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        fs, local_path = url_to_fs(str(path))
        if storage_options is not None or not isinstance(fs, LocalFileSystem):
            return super().save_checkpoint(checkpoint, path, storage_options)  # what Lightning does
        target = Path(local_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}{TEMPORARY_SUFFIX}")
        try:
            # O_EXCL: a file of our own; 0o666 less the umask, the mode a plain open gives
            with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
        _fsync_directory(target.parent)  # the rename itself, on disk
        for stale in target.parent.glob(f".{target.name}.*{TEMPORARY_SUFFIX}"):
            with contextlib.suppress(OSError):  # left by a process killed while it saved
                stale.unlink()


def _fsync_directory(directory: Path) -> None:
    """Flush a directory's entries to disk, where the platform and filesystem allow it."""
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
