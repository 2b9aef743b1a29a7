"""Batch generation: config, prompt templating, row alignment, the real sampler, the CLI + eval."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hybridflow import fields as F
from hybridflow.cli import main as cli_main
from hybridflow.config import ConfigError
from hybridflow.data import DataRowError, read_rows, write_rows
from hybridflow.entrypoints.generate import (
    build_rollout,
    generate_file,
    load_generation_config,
    prompt_ids,
)
from hybridflow.models import load_model_and_tokenizer
from hybridflow.models.tiny import build_tiny_tokenizer
from hybridflow.protocol import DataProto
from hybridflow.workers.rollout.base import BaseRollout

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class EchoRollout(BaseRollout):
    """Sample j of a prompt = the prompt's real tokens + the ids of the text ``"#j"``; records calls."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.calls: list[dict] = []

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        ids, mask = prompts.batch[F.INPUT_IDS], prompts.batch[F.ATTENTION_MASK]
        n, pad = prompts.meta_info["n"], self.tokenizer.pad_token_id
        self.calls.append({"rows": ids.shape[0], **prompts.meta_info})
        rows = []
        for i in range(ids.shape[0]):
            real = ids[i][mask[i].bool()].tolist()
            rows += [real + self.tokenizer(f"#{j}")["input_ids"] for j in range(n)]
        width = max(len(r) for r in rows) + 2  # right padding the rollout would leave
        responses = torch.full((len(rows), width), pad)
        response_mask = torch.zeros_like(responses)
        for k, r in enumerate(rows):
            responses[k, : len(r)] = torch.tensor(r)
            response_mask[k, : len(r)] = 1
        return DataProto.from_dict(tensors={F.RESPONSES: responses, F.RESPONSE_MASK: response_mask})

    def update_weights(self, weights) -> None:
        raise NotImplementedError


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def _rows(texts: list[str]) -> list[dict]:
    return [{"prompt": t, "data_source": "test", "extra": {"k": i}} for i, t in enumerate(texts)]


def _cfg(tmp_path, data_file, *extra: str):
    return load_generation_config(None, [f"data.path={data_file}", f"data.output_path={tmp_path / 'out.parquet'}",
                                         *extra])


def test_config_defaults_and_errors():
    cfg = load_generation_config(None, [])
    assert (cfg.data.n_samples, cfg.data.batch_size, cfg.rollout.temperature, cfg.seed) == (1, 32, 1.0, 0)
    with pytest.raises(ConfigError, match="data.n_samples"):
        load_generation_config(None, ["data.n_samples=0"])
    with pytest.raises(ConfigError, match="must end in .parquet or .jsonl"):
        load_generation_config(None, ["data.output_path=out.csv"])
    with pytest.raises(ConfigError, match="rollout.temprature"):
        load_generation_config(None, ["rollout.temprature=0.5"])


def test_prompts_are_chat_templated_or_raw(tmp_path, tokenizer):
    data = load_generation_config(None, []).data
    chat = prompt_ids(tokenizer, [{"role": "user", "content": "Hi", "name": None}], data, ValueError)
    assert tokenizer.decode(chat) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert prompt_ids(tokenizer, "Hi", data, ValueError) == chat  # a string is one user message
    raw = load_generation_config(None, ["data.apply_chat_template=false"]).data
    assert tokenizer.decode(prompt_ids(tokenizer, "Hi", raw, ValueError)) == "Hi"


def test_rows_keep_their_columns_and_get_n_responses_in_order(tmp_path, tokenizer):
    texts = ["alpha", "beta beta", "gamma", "delta is longer", "eps"]
    data_file = write_rows(_rows(texts), tmp_path / "prompts.jsonl")
    cfg = _cfg(tmp_path, data_file, "data.n_samples=3", "data.batch_size=2", "data.apply_chat_template=false",
               "seed=10")
    rollout = EchoRollout(tokenizer)
    out = read_rows(generate_file(cfg, rollout, tokenizer, progress=False))
    assert [row["prompt"] for row in out] == texts and [row["extra"] for row in out] == [{"k": i} for i in range(5)]
    assert [row[F.RESPONSES] for row in out] == [[f"{t}#{j}" for j in range(3)] for t in texts]
    assert [(c["rows"], c["n"], c["seed"]) for c in rollout.calls] == [(2, 3, 10), (2, 3, 11), (1, 3, 12)]
    assert not (tmp_path / "out.parquet.parts").exists()


def test_bad_rows_are_named(tmp_path, tokenizer):
    data_file = tmp_path / "bad.jsonl"
    data_file.write_text('{"prompt": "ok"}\n{"question": "no prompt column"}\n')
    with pytest.raises(DataRowError, match=r"row 1: field 'prompt': missing column"):
        generate_file(_cfg(tmp_path, data_file), EchoRollout(tokenizer), tokenizer, progress=False)
    long_file = write_rows([{"prompt": "word " * 50}], tmp_path / "long.jsonl")
    with pytest.raises(DataRowError, match="raise rollout.prompt_length"):
        generate_file(_cfg(tmp_path, long_file, "rollout.prompt_length=8"), EchoRollout(tokenizer), tokenizer,
                      progress=False)
    rollout = EchoRollout(tokenizer)
    cfg = _cfg(tmp_path, long_file, "rollout.prompt_length=8", "data.truncation=left", "data.apply_chat_template=false")
    out = read_rows(generate_file(cfg, rollout, tokenizer, progress=False))
    kept = tokenizer("word " * 50)["input_ids"][-8:]
    assert out[0][F.RESPONSES] == [tokenizer.decode(kept) + "#0"]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model_and_tokenizer(tiny_model_dir)


def test_real_sampler_greedy_responses_match_one_prompt_at_a_time(tmp_path, tiny_model_dir, tiny):
    model, tok = tiny
    texts = ["What is 7 + 5?", "Hi", "The quick brown fox jumps over the lazy dog."]
    data_file = write_rows(_rows(texts), tmp_path / "prompts.parquet")
    common = [f"model.path={tiny_model_dir}", "rollout.do_sample=false", "rollout.response_length=10",
              "rollout.dtype=fp32", "data.n_samples=2"]
    cfg = _cfg(tmp_path, data_file, *common, "data.batch_size=3")
    rollout = build_rollout(cfg, model, tok)
    together = read_rows(generate_file(cfg, rollout, tok, progress=False))
    for row, text in zip(together, texts, strict=True):
        single = write_rows(_rows([text]), tmp_path / "one.parquet")
        alone = read_rows(generate_file(_cfg(tmp_path / "single", single, *common), rollout, tok, progress=False))
        assert row[F.RESPONSES] == alone[0][F.RESPONSES]
        assert row[F.RESPONSES][0] == row[F.RESPONSES][1]  # greedy: both samples agree


def test_cli_generate_then_eval(tmp_path, tiny_model_dir):
    from hybridflow.entrypoints.data import main as data_main

    assert data_main(["arithmetic", "--out", str(tmp_path / "task"), "--train-size", "2", "--test-size", "5"]) == 0
    out = tmp_path / "gen.parquet"
    argv = ["generate", f"data.path={tmp_path / 'task' / 'test.parquet'}", f"data.output_path={out}",
            f"model.path={tiny_model_dir}", "data.n_samples=2", "data.batch_size=2", "rollout.response_length=6",
            "rollout.dtype=fp32"]
    assert cli_main(argv) == 0
    rows = read_rows(out)
    assert len(rows) == 5 and all(len(r[F.RESPONSES]) == 2 and all(isinstance(s, str) for s in r[F.RESPONSES])
                                  for r in rows)
    report = tmp_path / "eval.json"
    assert cli_main(["eval", f"data.path={out}", "reward_model.executor=inline", f"output_path={report}"]) == 0
    source = json.loads(report.read_text())["data_sources"]["hybridflow/arithmetic"]
    assert (source["prompts"], source["n"]) == (5, 2)
    assert 0.0 <= source["metrics"]["mean@2"]["value"] <= 1.0 and np.isfinite(source["metrics"]["mean@2"]["std"])
    assert cli_main(["generate", "data.n_samples=zero"]) == 2
