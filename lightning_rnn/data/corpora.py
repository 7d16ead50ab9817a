"""Built-in text corpora: the Python standard library sources and tiny-shakespeare.

``python_stdlib_text()`` needs no network and no files beyond the interpreter's own
standard library; ``tiny_shakespeare_path()`` downloads karpathy's 1.1 MB corpus once
into a cache directory.
"""
from __future__ import annotations

import os
import sysconfig
import tempfile
import urllib.request
from pathlib import Path

from ..utils.checks import check_choice
from .base import read_text_file

#: The stdlib modules whose sources make up the embedded corpus, in this order.
#: Files that a Python version lacks are skipped (the list exists in 3.10-3.13).
PYTHON_STDLIB_FILES: tuple[str, ...] = (
    "abc.py", "argparse.py", "ast.py", "base64.py", "bisect.py", "calendar.py", "cmd.py",
    "codecs.py", "collections/__init__.py", "colorsys.py", "configparser.py", "contextlib.py",
    "copy.py", "csv.py", "dataclasses.py", "difflib.py", "enum.py", "fnmatch.py",
    "fractions.py", "functools.py", "glob.py", "gzip.py", "heapq.py", "json/decoder.py",
    "json/encoder.py", "keyword.py", "linecache.py", "numbers.py", "operator.py", "pprint.py",
    "queue.py", "random.py", "sched.py", "shlex.py", "shutil.py", "statistics.py", "string.py",
    "textwrap.py", "tokenize.py", "typing.py", "uuid.py", "weakref.py",
)

TINY_SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)

BUILTIN_CORPORA = ("python_stdlib", "tiny_shakespeare")


def python_stdlib_text() -> str:
    """The sources of :data:`PYTHON_STDLIB_FILES` concatenated (about 1.26M characters on 3.11)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = [(root / name).read_text(encoding="utf-8") for name in PYTHON_STDLIB_FILES if (root / name).is_file()]
    if not parts:
        raise FileNotFoundError(f"no standard-library sources found under {root}; pass data.path=FILE")
    return "\n".join(parts)


class CorpusUnavailableError(RuntimeError):
    """A built-in corpus is not cached and cannot be downloaded (offline): the message says
    which setting (``data.path``) supplies a local copy instead."""


def default_cache_dir() -> Path:
    """``$LIGHTNING_RNN_CACHE`` if set, else ``~/.cache/lightning_rnn``."""
    return Path(os.environ.get("LIGHTNING_RNN_CACHE", Path.home() / ".cache" / "lightning_rnn"))


def download(url: str, dest: Path, timeout_s: float = 30.0) -> None:
    """Fetch ``url`` into ``dest`` atomically: concurrent processes never see a partial file."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        payload = response.read()
    fd, tmp = tempfile.mkstemp(dir=dest.parent, suffix=".part")
    with os.fdopen(fd, "wb") as f:
        f.write(payload)
    os.replace(tmp, dest)


def tiny_shakespeare_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """The local copy of tiny-shakespeare, downloaded on first use.

    Raises:
        CorpusUnavailableError: the file is not cached and cannot be downloaded (offline).
    """
    dest = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    dest = dest / "tinyshakespeare.txt"
    if not dest.is_file():
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise CorpusUnavailableError(f"cache directory {dest.parent} (LIGHTNING_RNN_CACHE or data.cache_dir) "
                                         f"cannot be made ({err.strerror})") from None
        try:
            download(TINY_SHAKESPEARE_URL, dest)
        except OSError as err:
            raise CorpusUnavailableError(
                f"could not download tiny-shakespeare from {TINY_SHAKESPEARE_URL} ({err}). "
                f"Offline? Download it elsewhere and pass data.path=/path/to/input.txt"
            ) from None  # the message carries the cause; the socket traceback would bury it
    return dest


def load_corpus(name: str, cache_dir: str | os.PathLike | None = None) -> str:
    """The text of the built-in corpus ``name`` (one of :data:`BUILTIN_CORPORA`)."""
    if check_choice("corpus", name, BUILTIN_CORPORA) == "python_stdlib":
        return python_stdlib_text()
    path = tiny_shakespeare_path(cache_dir)
    text = read_text_file(path)
    if not text:
        raise CorpusUnavailableError(f"the cached copy of tiny-shakespeare, {path}, is empty: delete it to "
                                     "download it again, or pass data.path=/path/to/input.txt")
    return text
