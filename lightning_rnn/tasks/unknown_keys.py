"""Keys the config does not have: what it has there instead, and the closest one.

A typo in an override (``model.rnn.hiden_size=64``) gets Hydra's hint to add the key with
``+``, after which the class the key belongs to refuses the argument with a TypeError that
names neither the key nor the class. These functions say which keys exist where the typo
is, and which of them is closest, for both: the override (checked before Hydra runs the
job) and the added key a class does not take.
"""
from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

#: Command-line flags after which Hydra reads a value, not an override.
VALUE_FLAGS = ("-c", "--cfg", "-p", "--package")
#: Flags that print something other than a run (help, info, completion) or compose another
#: config (another directory or primary config): no check, Hydra's own handling as it is.
UNCHECKED_FLAGS = ("--version", "-i", "--info", "-sc", "--shell-completion",
                   "-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir", "--experimental-rerun")
#: The TypeError Python raises for a keyword argument a callable does not take.
UNEXPECTED_ARGUMENT = re.compile(r"got an unexpected keyword argument '(\w+)'")


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate most like ``name`` (a typo of it), or None if none is close."""
    matches = difflib.get_close_matches(name, [c for c in candidates if c != name], n=1, cutoff=0.6)
    return matches[0] if matches else None


def describe_missing_key(cfg: DictConfig, key: str) -> str:
    """What a dotted ``key`` that ``cfg`` lacks misses: the deepest part of it that exists,
    its keys, and the one closest to the missing part."""
    parts = key.split(".")
    node, depth = cfg, 0
    while depth < len(parts) - 1 and OmegaConf.is_dict(node) and parts[depth] in node:
        node, depth = node._get_node(parts[depth]), depth + 1
    where = ".".join(parts[:depth])
    if not OmegaConf.is_dict(node):
        return f"{key}: {where} is a value, not a group of keys"
    keys = [str(k) for k in node]
    missing = "no such key" if depth == len(parts) - 1 else f"{where or 'the config'} has no key {parts[depth]}"
    suggestion = closest(parts[depth], keys)
    hint = f"; did you mean {'.'.join([*parts[:depth], suggestion])}?" if suggestion else "."
    owner = f"the keys of {where}" if where else "the config's keys"
    return f"{key}: {missing}{hint} {owner[:1].upper()}{owner[1:]}: {', '.join(keys)}"


def override_list(args: Sequence[str]) -> list[str] | None:
    """The overrides among command-line ``args``; None where a flag makes the check moot."""
    overrides, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in UNCHECKED_FLAGS or arg.split("=", 1)[0] in UNCHECKED_FLAGS:
            return None
        elif arg in VALUE_FLAGS:
            skip = True
        elif not arg.startswith("-"):
            overrides.append(arg)
    return overrides


def unknown_override_error(config_dir: Path, args: Sequence[str], limit: int = 5) -> str | None:
    """The error for overrides in ``args`` of keys the composed config does not have (up to
    ``limit`` of them), or None: they all exist, or composing fails for another reason
    (a missing option, a syntax error, which Hydra reports as it runs). Sweeps (``a=1,2``)
    are left to Hydra: their jobs compose configs of their own."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import ConfigCompositionException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    overrides = override_list(args)
    if not overrides:
        return None
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException:
        return None
    if any(override.is_sweep_override() for override in parsed):
        return None
    unknown: list[str] = []
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        for _ in range(limit + 1):
            try:
                cfg = compose("config", overrides=overrides)
                break
            except ConfigCompositionException as err:
                cause = err.__cause__
                missing = getattr(cause, "full_key", None)  # the first part of the key that is missing
                if not isinstance(cause, (ConfigKeyError, ConfigAttributeError)) or not missing or \
                        len(unknown) == limit:
                    return None
                keys = [o.key_or_group for o in parsed if o.key_or_group == missing
                        or o.key_or_group.startswith(f"{missing}.")]
                if not keys:
                    return None
                unknown.append(keys[0])
                overrides = [line for line, override in zip(overrides, parsed) if override.key_or_group != keys[0]]
                parsed = [override for override in parsed if override.key_or_group != keys[0]]
        else:
            return None
    if not unknown:
        return None
    return "\n".join(f"Error: {describe_missing_key(cfg, key)}" for key in unknown)


def unexpected_argument_error(err: BaseException, cfg: DictConfig) -> str | None:
    """For a TypeError that a class of the config raised for a keyword argument it does not
    take (a key added with ``+``): which config key that is, which arguments the class does
    take and the closest of them; else None."""
    match = UNEXPECTED_ARGUMENT.search(str(err)) if isinstance(err, TypeError) else None
    if match is None:
        return None
    name = match.group(1)
    places = [(where, node) for where, node in target_nodes(OmegaConf.to_container(cfg, resolve=False))
              if name in node]
    if len(places) != 1:
        return None
    where, node = places[0]
    target = str(node["_target_"])
    accepted = accepted_arguments(target)
    if name in accepted:  # the class takes it: the TypeError is about another call
        return None
    accepted = accepted or [k for k in node if not k.startswith("_")]
    suggestion = closest(name, accepted)
    hint = f"; did you mean {where}.{suggestion}?" if suggestion else ""
    return (f"{where}.{name}: {target.rsplit('.', 1)[-1]} takes no argument {name}{hint} "
            f"It takes: {', '.join(k for k in accepted if k != name)}")


def target_nodes(node, where: str = ""):
    """(dotted location, dict) for every dict of a plain config container with a ``_target_``."""
    if isinstance(node, dict):
        if "_target_" in node:
            yield where, node
        for key, value in node.items():
            yield from target_nodes(value, f"{where}.{key}" if where else str(key))


def accepted_arguments(target: str) -> list[str]:
    """The keyword arguments the class or function ``target`` takes by name: a class's
    ``__init__`` and, where it passes ``**kwargs`` on, its bases' (as the modules do to
    RNNModule); [] if it does not import."""
    from hydra.utils import get_object

    try:
        obj = get_object(target)
    except Exception:  # not importable: the config's own keys stand in
        return []
    functions = [c.__dict__["__init__"] for c in obj.__mro__ if "__init__" in c.__dict__] if inspect.isclass(obj) \
        else [obj]
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names: list[str] = []
    for function in functions:
        try:
            parameters = inspect.signature(function).parameters.values()
        except (TypeError, ValueError):  # a builtin without a signature
            break
        names += [p.name for p in parameters if p.kind in kinds and p.name != "self" and p.name not in names]
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            break
    return names
