"""CharLanguageModel: embedding -> recurrent encoder -> per-step vocabulary logits."""
from __future__ import annotations

import logging
import math
from collections import deque
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from ..data.vocab import CharVocab
from ..layers import TemporalAdapter
from ..utils.checks import check_callable, check_choice, check_int, check_seed
from .generation import DECODERS, PackedWeightsCache, decode_texts, make_decoder, repeat_rows
from .rnn_module import RNNModule
from .sampling import check_length, check_sampling_arguments, check_stop, plain_number
from .text_logging import log_text_samples

log = logging.getLogger(__name__)


class CharLanguageModel(RNNModule):
    """Next-character model over the vocabulary ``vocab`` (a string of distinct characters).

    Batches: ``inputs`` and ``targets`` (B, T) int64 ids; predictions are logits (B, T, V).
    Logs the loss in nats per character and, derived from it, ``bpc`` (bits per
    character) and ``ppl`` (perplexity). After every validation it samples
    ``val_sample_length`` characters and logs them: under wandb a table of the newest
    :attr:`val_samples_kept` samples, logged whole each time (a table of every sample would
    make each log bigger than the last, and wandb keeps at most 10,000 rows of one); under
    TensorBoard as text; with no logger that takes text (CSV, none) as an INFO message of
    this module's logger (the console and ``cli.log`` in a command-line run).

    Args:
        vocab: the characters, stored in the checkpoint so sampling needs nothing else.
        embedding_dim: size of the character embedding (the rnn's input size).
        val_sample_length: characters sampled after each validation; 0 disables it.
        val_sample_temperature: temperature of that sample.
        **kwargs: the :class:`RNNModule` arguments (``rnn``, ``optimizer``, ...).
    """

    derived_arguments = ("input_size",)

    #: Rows of the ``val/samples`` table: the newest samples, one per validation.
    val_samples_kept: int = 100

    def __init__(self, vocab: str, embedding_dim: int = 64, val_sample_length: int = 200,
                 val_sample_temperature: float = 0.8, **kwargs):
        # checked now, not when the first validation samples (after a whole training interval)
        check_length(val_sample_length, "val_sample_length")
        check_sampling_arguments(val_sample_temperature, None, temperature_name="val_sample_temperature")
        check_int("embedding_dim", embedding_dim, 1)  # named here: the rnn would call it input_size
        super().__init__(input_size=embedding_dim, **kwargs)
        if self.num_directions == 2:
            raise ValueError("rnn: a language model reads left to right; a bidirectional rnn's reverse direction "
                             "would read the characters it is to predict (use a unidirectional rnn)")
        self.vocab = CharVocab(vocab)
        self.input_layer = nn.Embedding(len(self.vocab), embedding_dim)
        self.output_layer = TemporalAdapter(nn.Linear(self.rnn_output_size, len(self.vocab)))
        self._val_samples: deque[tuple[int, str]] = deque(maxlen=self.val_samples_kept)
        self._packed_weights = PackedWeightsCache()  # the compiled generation loop's copy of the weights

    def encode(self, inputs, state=None, lengths=None):
        self.check_token_ids(inputs)
        return super().encode(inputs, state, lengths)

    def check_token_ids(self, inputs) -> None:
        """A ValueError naming ``inputs`` unless they are integer ids of the vocabulary (padded
        or packed), rather than the embedding's IndexError. Skipped where a subclass replaced
        the embedding. The ids' range is read on CPU only: on a GPU that read would be one
        synchronization per step (torch.nn.Embedding, too, leaves it to a device-side assert)."""
        if not isinstance(self.input_layer, nn.Embedding):
            return
        ids = inputs.data if isinstance(inputs, PackedSequence) else inputs
        if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            described = f"{ids.dtype} of shape {tuple(ids.shape)}" if isinstance(ids, torch.Tensor) \
                else type(ids).__name__
            raise ValueError(f"inputs: expected integer character ids of shape (B, T), got {described}")
        size = self.input_layer.num_embeddings
        if ids.numel() and ids.device.type == "cpu":
            low, high = (int(v) for v in torch.aminmax(ids))  # one read
            if low < 0 or high >= size:
                raise ValueError(f"inputs: expected ids in [0, {size - 1}] (the vocabulary's {size} characters), "
                                 f"got ids from {low} to {high}")

    def head(self, features: torch.Tensor) -> torch.Tensor:
        """(B, T, D*H) -> logits (B, T, V)."""
        return self.output_layer(features)

    def compute_loss(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        """Mean cross-entropy per character, in nats."""
        if isinstance(logits, PackedSequence):
            raise ValueError("lengths: CharLanguageModel trains on fixed-length character streams, batches of "
                             "(B, T) inputs and targets without 'lengths' (nor packed by PackedSequences)")
        return F.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten())

    def loss_weight(self, batch: dict) -> int:
        return batch["targets"].numel()

    def derived_metrics(self, loss: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"bpc": loss / math.log(2), "ppl": loss.exp()}

    @torch.no_grad()
    def sample(self, start_text: str = "", length: int = 200, temperature: float = 1.0, top_k: int | None = None,
               seed: int | None = None, *, top_p: float | None = None, num_samples: int | None = None,
               stop: str | None = None, on_text: Callable[[int, str], None] | None = None,
               decoder: str = "auto") -> str | list[str]:
        """``start_text`` followed by ``length`` generated characters (a list of
        ``num_samples`` such texts when it is given, drawn side by side).

        The prefix runs through the network once; then each character is drawn with
        ``temperature``, ``top_k`` and ``top_p`` (see
        :func:`~lightning_rnn.modules.sampling.sample_next`) and fed back with the carried
        state, one step at a time. With an empty ``start_text`` the first of the ``length``
        characters is drawn uniformly. ``seed`` makes the result reproducible without
        touching the global RNG.

        Args:
            stop: a text ends before the first occurrence of this string in its generated
                characters (None: after ``length`` of them).
            on_text: called as ``on_text(index, text)`` with each piece of sample ``index``'s
                text as it is generated (the start text first); a sample's pieces joined are
                its final text.
            decoder: ``"loop"`` runs the network's forward once per character; ``"compiled"``
                runs the whole loop in C++ (:mod:`lightning_rnn.modules.generation` says for
                which models), a ValueError where it cannot; ``"auto"`` (default) compiled
                where the rnn runs on the compiled CPU kernels itself, else the loop. Both
                draw from the same distribution, but their random draws differ: the same
                seed gives each its own text.
        """
        length, seed = check_length(length), check_seed(plain_number(seed), optional=True)
        temperature, top_k, top_p = check_sampling_arguments(temperature, top_k, top_p)
        rows = 1 if num_samples is None else check_int("num_samples", plain_number(num_samples), 1)
        stop = check_stop(stop)
        check_choice("decoder", decoder, DECODERS)
        check_callable("on_text", on_text, "a callable on_text(index, text)", optional=True)
        generator = torch.Generator(device=self.device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        if start_text:
            prefix = self.vocab.encode(start_text, name="start_text").to(self.device).view(1, -1)
            starts = [start_text] * rows
        elif length:
            prefix = torch.randint(len(self.vocab), (rows, 1), generator=generator, device=self.device)
            starts, length = [self.vocab.decode(first) for first in prefix], length - 1
        else:
            starts = [""] * rows
        was_training = self.training
        self.eval()
        try:
            steps = None  # no decoder when no character is left to draw
            if length:
                logits, state = self(prefix)  # (1 or rows, T, V)
                logits, state = repeat_rows(logits[:, -1], rows), repeat_rows(state, rows)
                steps = make_decoder(decoder, self, self._generation_parts(), logits, state, temperature, top_k,
                                     top_p, generator, self._packed_weights)
            texts = decode_texts(steps, self.vocab, starts, length, stop, on_text)
        finally:
            self.train(was_training)
        return texts[0] if num_samples is None else texts

    def _generation_parts(self) -> tuple[nn.Module, nn.Module, nn.Module] | str:
        """(embedding, rnn, output Linear) for the compiled generation loop, or why this
        model is not that: a subclass that computes its predictions otherwise."""
        own = (type(self).forward is RNNModule.forward and type(self).encode is CharLanguageModel.encode
               and type(self).head is CharLanguageModel.head)
        if not own or type(self.output_layer) is not TemporalAdapter:
            return f"{type(self).__name__} computes its predictions otherwise than CharLanguageModel"
        return self.input_layer, self.rnn, self.output_layer.module

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        length = self.hparams.val_sample_length
        if length and not self.trainer.sanity_checking and self.trainer.is_global_zero:
            text = self.sample("", length, self.hparams.val_sample_temperature, seed=self.global_step)
            self._val_samples.append((self.global_step, text))
            if not log_text_samples(self.loggers, "val/samples", self._val_samples):
                log.info("val/samples at step %d:\n%s", self.global_step, text)
