"""A model path given as a Hugging Face Hub id, downloaded from a fake Hub on 127.0.0.1.

huggingface_hub itself does the HTTP (tests/models/fake_hub.py speaks its protocol), so these
tests check the whole path: id parsing, what is fetched, the cache, offline mode, resuming,
and the one-line errors.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants

from hybridflow.models import HubModelError, load_model_and_tokenizer, load_tokenizer, resolve_model_path
from hybridflow.models.hub import HubId, parse_hub_id
from hybridflow.models.tiny import save_tiny_model
from tests.models.fake_hub import FakeHub, point_hub_client_at

REPO = "tiny-org/tiny-qwen2"
EXTRA_FILES = {  # in the repo, but not needed to load it: never downloaded
    "pytorch_model.bin": b"a duplicate of the weights in pickle format",
    "model.Q4_K_M.gguf": b"a quantised copy",
    "consolidated.safetensors": b"the original checkpoint layout",
    "original/params.json": b"{}",
    "onnx/model.onnx": b"an export",
}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("src") / "tiny", arch="qwen2", seed=0)


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: Path) -> Iterator[FakeHub]:
    fake = FakeHub()
    fake.add_revision(REPO, source, extra=EXTRA_FILES)
    point_hub_client_at(monkeypatch, fake.start(), tmp_path / "hf")
    monkeypatch.chdir(tmp_path)  # a relative folder named like the id must not exist by accident
    yield fake
    fake.stop()


def logits(path: str | Path) -> torch.Tensor:
    model, tokenizer = load_model_and_tokenizer(path)
    ids = tokenizer("What is 7 + 5? The answer is 12.", return_tensors="pt").input_ids
    with torch.no_grad():
        return model(ids).logits


def test_parse_hub_id() -> None:
    assert parse_hub_id("Qwen/Qwen2.5-0.5B-Instruct") == HubId("Qwen/Qwen2.5-0.5B-Instruct")
    assert parse_hub_id("org/name@v1.0") == HubId("org/name", "v1.0")
    assert parse_hub_id("org/name@refs/pr/1") == HubId("org/name", "refs/pr/1")
    assert str(HubId("org/name", "dev")) == "org/name@dev"
    for text in ("name", "a/b/c", "./org/name", "/abs/path", "~/x", "org/na--me", "org/name@", "org/ name", "org/"):
        assert parse_hub_id(text) is None, text


def test_hub_id_downloads_only_loading_files_and_loads_like_the_source(hub: FakeHub, source: Path) -> None:
    folder = resolve_model_path(REPO)
    assert folder.parent.parent == Path(constants.HF_HUB_CACHE) / "models--tiny-org--tiny-qwen2"
    wanted = sorted(p.name for p in source.iterdir())
    assert sorted(hub.downloaded()) == wanted  # config, tokenizer, chat template, safetensors; no EXTRA_FILES
    assert sorted(p.name for p in folder.iterdir()) == wanted
    assert load_tokenizer(REPO).encode("7 + 5 = 12") == load_tokenizer(source).encode("7 + 5 = 12")
    assert torch.equal(logits(REPO), logits(source))


def test_second_resolve_is_a_cache_hit_without_network(hub: FakeHub) -> None:
    first = resolve_model_path(REPO)
    hub.stop()
    before = len(hub.requests)
    assert resolve_model_path(REPO) == first
    assert len(hub.requests) == before


def test_offline_needs_the_cache(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubModelError) as err:
        resolve_model_path(REPO)
    message = str(err.value)
    assert "\n" not in message
    assert f"model {REPO} is not in the Hugging Face cache at {constants.HF_HUB_CACHE}" in message
    assert "unset HF_HUB_OFFLINE" in message and "pass a local model folder" in message
    assert hub.requests == []
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    folder = resolve_model_path(REPO)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    before = len(hub.requests)
    assert resolve_model_path(REPO) == folder
    assert len(hub.requests) == before


def test_missing_repo_and_revision_errors_name_them(hub: FakeHub) -> None:
    with pytest.raises(HubModelError) as err:
        resolve_model_path("tiny-org/no-such-model")
    assert str(err.value) == (
        f"model path 'tiny-org/no-such-model' is not a local folder and no model repo 'tiny-org/no-such-model' was "
        f"found on {constants.ENDPOINT}; check the id, or set HF_TOKEN if the repo is private or gated"
    )
    with pytest.raises(HubModelError, match=rf"revision 'v9' of model repo '{REPO}' was not found on http://127"):
        resolve_model_path(f"{REPO}@v9")


def test_gated_repo_error_mentions_hf_token(hub: FakeHub) -> None:
    hub.repos[REPO].gated = True
    with pytest.raises(HubModelError, match=rf"^{REPO} on http://127\S+ is a gated repo: .* set HF_TOKEN"):
        resolve_model_path(REPO)


def test_revision_picks_that_revision(hub: FakeHub, source: Path, tmp_path: Path) -> None:
    other = shutil.copytree(source, tmp_path / "v2")
    config = json.loads((other / "config.json").read_text())
    config["max_position_embeddings"] = 2 * config["max_position_embeddings"]
    (other / "config.json").write_text(json.dumps(config))
    main_commit = hub.repos[REPO].refs["main"]
    commit = hub.add_revision(REPO, other, ref="v2")

    def config_of(model_path: str) -> bytes:
        return (resolve_model_path(model_path) / "config.json").read_bytes()

    assert config_of(f"{REPO}@v2") == config_of(f"{REPO}@{commit}") == (other / "config.json").read_bytes()
    assert config_of(REPO) == config_of(f"{REPO}@{main_commit}") == (source / "config.json").read_bytes()
    assert resolve_model_path(f"{REPO}@v2").name == commit  # the snapshot folder of that commit


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub writes (and can resume after) whole chunks of DOWNLOAD_CHUNK_SIZE (10 MB):
    a smaller chunk lets the 1.4 MB tiny model show a resume."""
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)


@pytest.mark.usefixtures("small_chunks")
def test_cut_transfer_is_resumed_in_the_same_call(hub: FakeHub, source: Path) -> None:
    size = (source / "model.safetensors").stat().st_size
    hub.truncate_first_get.add("model.safetensors")
    folder = resolve_model_path(REPO)
    ranges = [r for method, path, r in hub.requests if method == "GET" and path.endswith("/model.safetensors")]
    assert len(ranges) == 2 and ranges[0] is None and ranges[1] is not None
    start = int(ranges[1].removeprefix("bytes=").removesuffix("-"))
    assert size // 2 - 64 * 1024 < start <= size // 2  # the whole chunks received before the cut are kept
    assert (folder / "model.safetensors").read_bytes() == (source / "model.safetensors").read_bytes()


@pytest.mark.usefixtures("small_chunks")
def test_failed_download_is_one_line_and_the_next_call_completes(hub: FakeHub, source: Path) -> None:
    hub.truncate_first_get.add("model.safetensors")
    hub.refuse_resume = True
    with pytest.raises(HubModelError) as err:
        resolve_model_path(REPO)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"downloading {REPO} from {constants.ENDPOINT} failed (HfHubHTTPError: ")
    assert "503" in message
    assert message.endswith(
        f"run again to retry (files already complete stay in the cache at {constants.HF_HUB_CACHE})"
    )
    hub.refuse_resume = False
    fetched_before = len(hub.downloaded())
    folder = resolve_model_path(REPO)
    assert hub.downloaded()[fetched_before:] == ["model.safetensors"]  # the other files were kept
    assert (folder / "model.safetensors").read_bytes() == (source / "model.safetensors").read_bytes()


def test_repo_with_only_pickle_weights_gets_them(hub: FakeHub, source: Path, tmp_path: Path) -> None:
    folder = shutil.copytree(source, tmp_path / "bin-only", ignore=shutil.ignore_patterns("*.safetensors"))
    model, _ = load_model_and_tokenizer(source)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    hub.add_revision("tiny-org/bin-only", folder, extra={"training_args.bin": b"not weights"})
    local = resolve_model_path("tiny-org/bin-only")
    assert sorted(p.name for p in local.glob("*.bin")) == ["pytorch_model.bin"]
    assert torch.equal(logits("tiny-org/bin-only"), logits(source))


def test_concurrent_resolves_share_one_good_copy(hub: FakeHub, source: Path) -> None:
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(resolve_model_path(REPO))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4 and len(set(results)) == 1
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (results[0] / name).read_bytes() == (source / name).read_bytes()


def test_local_folder_wins_over_a_hub_id(hub: FakeHub, source: Path, tmp_path: Path) -> None:
    shutil.copytree(source, tmp_path / REPO)
    assert resolve_model_path(REPO) == Path(REPO)
    assert hub.requests == []


def test_other_strings_keep_the_plain_error() -> None:
    with pytest.raises(
        FileNotFoundError, match=r"^model path 'no-such-name' is not an existing folder and not a known"
    ):
        resolve_model_path("no-such-name")


def test_a_grpo_run_trains_a_model_named_by_its_hub_id(
    hub: FakeHub, tmp_path: Path, tiny_task_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole job, not only the loader: `hybridflow train` with model.path=org/name (actor,
    reference and rollout all load it), 2 GRPO steps, then the same id again offline."""
    from hybridflow.config import load_config
    from hybridflow.entrypoints.train import run
    from tests.trainer.conftest import tiny_overrides

    run_dir = tmp_path / "run"
    overrides = tiny_overrides(tiny_task_dir, run_dir, Path("unused"), "actor_rollout_ref.actor.use_kl_loss=true")
    overrides = [o for o in overrides if not o.startswith("actor_rollout_ref.model.path=")]
    metrics = run(load_config(None, [*overrides, f"actor_rollout_ref.model.path={REPO}", "trainer.device=cpu"]))
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "actor/pg_loss" in s] == [1, 2]
    assert metrics["actor/grad_norm"] > 0
    fetched = len(hub.requests)
    assert fetched > 0
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # the cache serves it from now on
    assert (resolve_model_path(REPO) / "config.json").is_file() and len(hub.requests) == fetched
