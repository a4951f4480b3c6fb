"""Typed configuration: each service declares a frozen dataclass of settings with the defaults a
local cluster needs; values come from flags (``--segment-bytes``), then environment variables
(``KBROKER_SEGMENT_BYTES``), then the default. Read once at start-up.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

ENV_PREFIX = "KBROKER_"


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _parse(kind: type, raw: str) -> object:
    if kind is bool:
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"not a boolean: {raw!r}")
    if kind is int:
        return int(raw)
    if kind is float:
        return float(raw)
    if typing.get_origin(kind) is tuple:
        return tuple(p.strip() for p in raw.split(",") if p.strip())
    return raw


def load(cls: type[T], argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> T:
    """Build ``cls`` from flags, environment and defaults. Unknown flags are an error."""
    env = dict(os.environ) if env is None else env
    hints = typing.get_type_hints(cls)
    parser = argparse.ArgumentParser(prog=cls.__name__, description=cls.__doc__)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        doc = (f.metadata or {}).get("help", "")
        parser.add_argument(flag_name(f.name), dest=f.name, default=None,
                            help=f"{doc} (env {env_name(f.name)})")
    args = parser.parse_args(list(argv) if argv is not None else [])
    values = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        raw = getattr(args, f.name)
        if raw is None:
            raw = env.get(env_name(f.name))
        if raw is not None:
            values[f.name] = _parse(hints[f.name], raw)
    return cls(**values)


def option(default: object, help: str) -> typing.Any:
    """A config field with documentation."""
    return dataclasses.field(default=default, metadata={"help": help})
