"""``python -m lightning_rnn.bench [--preset NAME] [key=value ...]`` (or ``--replot DIR``,
``--write-page ROOT PAGE``).

Loads ``conf/bench/<NAME>.yaml`` (default, smoke, full), applies the overrides (OmegaConf
dot-list syntax, e.g. ``grid.hidden=[64,128] grid.cells=[lstm] threads=2``) and runs
:func:`lightning_rnn.bench.main`.
"""
from __future__ import annotations

import argparse

from .config import load_preset
from .harness import main, replot
from .page import write_page


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m lightning_rnn.bench", description=__doc__.split("\n\n")[1])
    parser.add_argument("--preset", default="default", help="a file stem in conf/bench/ (default: %(default)s)")
    parser.add_argument("--replot", metavar="DIR", help="only redraw the PNGs in DIR from its CSVs, measuring nothing")
    parser.add_argument("--write-page", nargs=2, metavar=("ROOT", "PAGE"),
                        help="only rebuild the Markdown PAGE from the result folders in ROOT, measuring nothing")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. grid.hidden=[64,128]")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    if args.replot:
        print("\n".join(map(str, replot(args.replot))))
    elif args.write_page:
        print(write_page(args.write_page[1], args.write_page[0]))
    else:
        main(load_preset(args.preset, args.overrides))
