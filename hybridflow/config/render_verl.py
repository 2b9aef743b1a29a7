"""The docs table of every key of verl's config files and what hybridflow does with it.

Rows come from the key lists under ``tests/config/fixtures/verl/`` (written from verl's files
by ``scripts/verl_config_keys.py``) and the fates from :func:`explain_verl_key`, so the table,
the loader and the tests give one answer; ``python -m hybridflow.config.generate`` rewrites it.
"""

from __future__ import annotations

from pathlib import Path

from hybridflow.config.verl_keys import VERL_COMMIT, VERL_COMMIT_DATE, VERL_CONFIG_FILES, explain_verl_key

KEY_LISTS = Path(__file__).resolve().parents[2] / "tests" / "config" / "fixtures" / "verl"
SHORT = {
    "_generated_ppo_trainer": "ppo",
    "_generated_ppo_megatron_trainer": "megatron",
    "sft_trainer": "sft",
    "sft_trainer_engine": "sft-engine",
    "fully_async_ppo_trainer": "fully-async",
    "one_step_off_ppo_trainer": "one-step-off",
}


def _keys(stem: str) -> list[str]:
    lines = (KEY_LISTS / f"{stem}.keys").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def render_verl_files_markdown() -> str:
    """One row per distinct (config root, key) of the six files: files, status, our key or reason."""
    rows: dict[tuple[str, str], list[str]] = {}
    for stem, (_, root) in VERL_CONFIG_FILES.items():
        for key in _keys(stem):
            rows.setdefault((root.__name__, key), []).append(SHORT[stem])
    out = [
        f"verl {VERL_COMMIT} ({VERL_COMMIT_DATE}); files: "
        + ", ".join(f"{short} = `{VERL_CONFIG_FILES[stem][0]}`" for stem, short in SHORT.items()),
        "",
        "| verl key | files | status | our key, or why |",
        "|---|---|---|---|",
    ]
    for (root_name, key), files in rows.items():
        root = next(r for _, r in VERL_CONFIG_FILES.values() if r.__name__ == root_name)
        fate = explain_verl_key(key, root)
        what = "same key" if fate.ours == key else f"`{fate.ours}`" if fate.ours else ""
        what = f"{what} ({fate.reason})" if what and fate.reason else what or fate.reason
        out.append(f"| `{key}` | {', '.join(files)} | {fate.status} | {what.replace('|', chr(92) + '|')} |")
    return "\n".join(out) + "\n"
