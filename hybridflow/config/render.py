"""Text generated from the config declarations: the commented YAML of defaults and the doc tables.

Both outputs are checked into the repository (``hybridflow/config/ppo_trainer.yaml`` and the
reference part of ``docs/configuration.md``) and a test fails when they drift from the
dataclasses; ``python -m hybridflow.config.generate`` rewrites them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml

from hybridflow.config.build import to_dict
from hybridflow.config.spec import (
    config_fields,
    default_of,
    describe_type,
    field_types,
    help_of,
    is_section,
    iter_leaves,
    iter_sections,
)
from hybridflow.config.verl_compat import VERL_IGNORED_KEYS, VERL_RENAMED_KEYS

REGENERATE_COMMAND = "python -m hybridflow.config.generate"


def inline_yaml(value: Any) -> str:
    """One value as single-line YAML: ``null``, ``true``, ``1.0e-06``, ``[console]``, ``{}``."""
    if dataclasses.is_dataclass(value):
        value = to_dict(value)
    if isinstance(value, tuple):
        value = list(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=1_000_000, allow_unicode=True).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def render_defaults_yaml(root_cls: type, title: str) -> str:
    """The defaults of ``root_cls`` as commented YAML (every key with its help text above it)."""
    header = [
        f"# {title} — defaults, generated from the dataclasses in hybridflow/config/.",
        f"# Do not edit: change the dataclasses and run `{REGENERATE_COMMAND}`.",
        "# null values documented as '= <other key>' are filled in when the config is loaded.",
        "",
    ]
    return "\n".join(header + _yaml_section(root_cls(), 0)) + "\n"


def _yaml_section(instance: Any, depth: int) -> list[str]:
    indent = "  " * depth
    lines: list[str] = []
    for name, f in config_fields(type(instance)).items():
        value = getattr(instance, name)
        if depth == 0 and lines:
            lines.append("")
        lines.append(f"{indent}# {help_of(f)}")
        if is_section(f):
            lines.append(f"{indent}{name}:")
            lines += _yaml_section(value, depth + 1)
        else:
            lines.append(f"{indent}{name}: {inline_yaml(value)}")
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_reference_markdown(root_cls: type) -> str:
    """Markdown tables of every key under ``root_cls`` (type, default, meaning), one per section."""
    out: list[str] = []
    sections = [("", root_cls, "")] + list(iter_sections(root_cls))
    for path, cls, help_text in sections:
        leaves = [(name, f) for name, f in config_fields(cls).items() if not is_section(f)]
        if not leaves:
            continue
        out += [f"### `{path}`", ""] if path else []
        out += [f"{help_text[0].upper()}{help_text[1:]}.", ""] if help_text else []
        out += ["| key | type | default | meaning |", "|---|---|---|---|"]
        types_ = field_types(cls)
        for name, f in leaves:
            key = f"{path}.{name}" if path else name
            default = inline_yaml(default_of(f))
            out.append(f"| `{key}` | {_cell(describe_type(types_[name]))} | `{_cell(default)}` | {_cell(help_of(f))} |")
        out.append("")
    return "\n".join(out)


def render_verl_markdown() -> str:
    """Markdown list of the verl keys accepted without use, and of the renamed ones."""
    out = ["| verl key pattern | handling |", "|---|---|"]
    for entry in VERL_IGNORED_KEYS:
        handling = "accepted only while off (null/false/empty), else an error" if entry.only_when_off else "ignored"
        out.append(f"| `{entry.pattern}` | {handling}: {_cell(entry.reason)} |")
    for renamed in VERL_RENAMED_KEYS:
        out.append(f"| `{renamed.pattern}` | renamed: read as `…{renamed.new_name}` |")
    return "\n".join(out) + "\n"


def leaf_paths(root_cls: type) -> list[str]:
    """Every leaf key of ``root_cls`` as a dotted path (for completeness checks)."""
    return [path for path, _, _ in iter_leaves(root_cls)]
