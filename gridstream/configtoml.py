"""A configuration written back as TOML: what ``gridstream config show``
prints (optionally saying where each value came from) and what a local
cluster hands its members."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gridstream.config import Config


def to_toml(config: Config, origins: Mapping[str, str] | None = None) -> str:
    """Renders a configuration as TOML, for ``gridstream config show`` and
    child processes; with ``origins``, each value is followed by a comment
    saying where it came from."""

    def line(key: str, name: str, value: Any) -> str:
        text = f"{name} = {_toml_value(value)}"
        return f"{text}  # {origins[key]}" if origins and key in origins else text

    lines: list[str] = []
    sections: list[tuple[str, Any]] = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            sections.append((f.name, value))
        else:
            lines.append(line(f.name, f.name, value))
    for name, value in sections:
        lines.append(f"\n[{name}]")
        for sub in dataclasses.fields(value):
            lines.append(line(f"{name}.{sub.name}", sub.name, getattr(value, sub.name)))
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)
