"""What one option's value may be, checked alone: numbers, platforms, the engines' environment,
the folder to sync. ``ClusterOptions`` checks them together."""

from __future__ import annotations

import os
import re
from typing import Any

from ..errors import ConfigError

PLATFORMS = ("cpu", "gpu", "cuda", "rocm", "tpu")
# a POSIX environment variable name, as shells accept it (``--env NAME=VALUE``, ``engine_env``)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def positive_int(value: Any, option: str, example: str) -> int:
    """``value`` as a whole number of at least 1, or a ``ConfigError`` naming ``option``."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value)
    else:
        number = 0
    if number < 1:
        raise ConfigError(
            f"{option} must be a whole number of at least 1, not {value!r} (e.g. {example})."
        )
    return number


def positive_seconds(value: Any) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if not seconds > 0:
        raise ConfigError("--timeout must be a positive number of seconds (e.g. --timeout 120).")
    return seconds


def _sync_folder(sync: Any) -> str | None:
    """The folder ``sync`` names: the working directory for True, none for False."""
    if sync is True:
        return os.getcwd()
    if sync is False or sync is None:
        return None
    if not isinstance(sync, str | os.PathLike):
        raise ConfigError(f"sync must be True, False or a folder's path, not {sync!r}.")
    return os.path.abspath(os.fspath(sync))


def check_engine_env(engine_env: Any) -> None:
    """A ``ConfigError`` unless ``engine_env`` maps variable names to strings."""
    if engine_env is None:
        return
    if not isinstance(engine_env, dict):
        raise ConfigError(
            f"engine_env must be a dict of variable names to strings, not "
            f"{type(engine_env).__name__} (e.g. engine_env={{'XLA_FLAGS': '--xla_dump_to=/tmp'}})."
        )
    for name, value in engine_env.items():
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise ConfigError(
                f"engine_env: {name!r} is not an environment variable name: use letters, digits "
                "and underscores, not starting with a digit (e.g. XLA_FLAGS)."
            )
        if not isinstance(value, str):
            raise ConfigError(
                f"engine_env[{name!r}] is {type(value).__name__} {value!r}, and the environment "
                f"holds strings only: pass {str(value)!r}."
            )


def _checked_platform(platform: str | None) -> str | None:
    if platform is None:
        return None
    platform = str(platform).lower()
    if platform not in PLATFORMS:
        raise ConfigError(
            f"Unknown platform {platform!r}. Choose one of: {', '.join(PLATFORMS)}, "
            "or leave --platform out to let JAX pick."
        )
    return platform
