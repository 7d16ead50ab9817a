"""``python -m lightning_rnn``: see :mod:`lightning_rnn.cli`."""
from lightning_rnn.cli import main

if __name__ == "__main__":
    main()
