"""Character vocabulary: the mapping between characters and integer ids."""
from __future__ import annotations

import torch


class CharVocab:
    """Bijection between the characters of ``chars`` and ids ``0..len(chars)-1``.

    ``chars`` is stored as a plain string (sorted, unique) so it can live in a
    checkpoint's hyperparameters: sampling then needs only the checkpoint.
    """

    def __init__(self, chars: str):
        if not isinstance(chars, str) or not chars:
            raise ValueError(f"chars: expected a non-empty string of characters, got {chars!r}")
        if len(set(chars)) != len(chars):
            raise ValueError("chars: expected unique characters, got duplicates")
        self.chars = chars
        self._index = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> "CharVocab":
        """The vocabulary of every distinct character in ``text``, sorted by code point."""
        return cls("".join(sorted(set(text))))

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str, name: str = "text") -> torch.Tensor:
        """``text`` as a ``(len(text),)`` int64 tensor of ids (errors name it ``name``)."""
        if not isinstance(text, str):
            raise TypeError(f"{name}: expected a str, got {type(text).__name__}")
        unknown = sorted(set(text) - self._index.keys())
        if unknown:
            raise ValueError(f"{name}: characters not in the vocabulary: {''.join(unknown)!r}")
        return torch.tensor([self._index[c] for c in text], dtype=torch.long)

    def decode(self, ids) -> str:
        """The characters of a sequence of ids (tensor or iterable of ints)."""
        return "".join(self.chars[i] for i in torch.as_tensor(ids).tolist())
