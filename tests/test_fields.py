"""Every ``meta_info`` key is declared once, with its meaning."""

from __future__ import annotations

from hybridflow import fields as F


def test_every_meta_constant_is_declared_once_with_a_meaning() -> None:
    constants = {name: value for name, value in vars(F).items() if name.startswith("META_") and name != "META_KEYS"}
    assert sorted(constants.values()) == sorted(F.META_KEYS)  # each constant in the table, no extra entry
    assert len(set(constants.values())) == len(constants)  # no two constants name the same key
    assert all(key.doc for key in F.META_KEYS.values())
    # verl's names, as verl's rollout and actor read them
    assert (F.META_EOS_TOKEN_ID, F.META_TEMPERATURE, F.META_DO_SAMPLE, F.META_VALIDATE) == (
        "eos_token_id", "temperature", "do_sample", "validate")
