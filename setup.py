"""Build hook: ship the Hydra configs inside the package.

``conf/`` (with ``conf/experiment`` -> ``recipes/``) stays the source of truth at the top
of the repository; building a wheel copies it, links resolved, to ``lightning_rnn/_conf``,
where ``lightning_rnn.cli`` looks first. Everything else lives in pyproject.toml.
"""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithConfigs(build_py):
    """``build_py`` that also copies ``conf/**/*.yaml`` into the built package."""

    def run(self):
        super().run()
        target = Path(self.build_lib) / "lightning_rnn" / "_conf"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(ROOT / "conf", target, ignore=_only_yaml)


# Run folders a CLI run may have left inside conf/ (through conf/experiment -> recipes/):
# their saved configs are not configs of the package.
RUN_FOLDERS = {"outputs", "multirun"}


def _only_yaml(directory, names):
    def skipped(name):
        if (Path(directory) / name).is_dir():
            return name in RUN_FOLDERS or name.startswith(".")
        return not name.endswith(".yaml")

    return [n for n in names if skipped(n)]


setup(cmdclass={"build_py": BuildPyWithConfigs})
