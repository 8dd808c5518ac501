"""``--model path/to/config.json``: Hugging Face configs of published models (the samples in
tests/fixtures/hf_configs, each naming its Hub repository) give the preset of the same
model, their approximations are said, and a config that lacks a key the spec needs is
refused with that key named."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from emulator import ConfigError
from emulator.planner import model_preset
from emulator.planner.__main__ import main as cli
from emulator.planner.hf_config import model_from_hf_config

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hf_configs"
SAMPLES = {"meta-llama__Meta-Llama-3-70B": "llama3-70b", "mistralai__Mixtral-8x22B-Instruct-v0.1": "mixtral-8x22b",
           "Qwen__Qwen3-235B-A22B": "qwen3-235b-a22b", "deepseek-ai__DeepSeek-V3": "deepseek-v3"}


def sample(name):
    return FIXTURES / f"{name}.config.json"


def shape(spec):
    return replace(spec, name="", source="", note="")


@pytest.mark.parametrize("name", SAMPLES)
def test_a_published_config_gives_its_models_preset(name):
    spec = model_from_hf_config(sample(name))
    assert shape(spec) == shape(model_preset(SAMPLES[name]))
    assert spec.name == name and str(sample(name)) in spec.source
    assert model_from_hf_config(json.loads(sample(name).read_text())) == replace(spec, name="", source=
                                                                                 "config (a Hugging Face config.json)")


def test_the_approximations_are_said_as_the_presets_say_them():
    deepseek = model_from_hf_config(sample("deepseek-ai__DeepSeek-V3")).note
    for part in ("multi-head latent attention (kv_lora_rank 512", "1 shared expert(s) (2048 wide) left out",
                 "the 3 dense first layers (18432 wide)", "multi-token prediction (1 layer) left out"):
        assert part in deepseek, deepseek
    qwen = model_from_hf_config(sample("Qwen__Qwen3-235B-A22B")).note
    assert "its heads are 128 wide (64 x 128 > d_model)" in qwen
    llama = model_from_hf_config(sample("meta-llama__Meta-Llama-3-70B")).note
    assert "latent" not in llama and "heads are" not in llama and "expert" not in llama


def edited(tmp_path, name, **changes):
    cfg = {k: v for k, v in json.loads(sample(name).read_text()).items() if changes.get(k, 0) is not None}
    cfg.update({k: v for k, v in changes.items() if v is not None})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("key", ["num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size",
                                 "intermediate_size"])
def test_a_missing_key_is_named(tmp_path, key):
    with pytest.raises(ConfigError, match=f"no '{key}'"):
        model_from_hf_config(edited(tmp_path, "meta-llama__Meta-Llama-3-70B", **{key: None}))


@pytest.mark.parametrize("name, key", [("deepseek-ai__DeepSeek-V3", "moe_intermediate_size"),
                                       ("deepseek-ai__DeepSeek-V3", "num_experts_per_tok"),
                                       ("Qwen__Qwen3-235B-A22B", "num_experts_per_tok")])
def test_a_missing_moe_key_is_named_not_guessed(tmp_path, name, key):
    with pytest.raises(ConfigError, match=f"no '{key}'"):
        model_from_hf_config(edited(tmp_path, name, **{key: None}))


def test_defaults_and_other_layouts(tmp_path):
    no_kv = model_from_hf_config(edited(tmp_path, "meta-llama__Meta-Llama-3-70B", num_key_value_heads=None))
    assert no_kv.n_kv_heads == 64  # transformers' default: one K/V head per query head
    dense_qwen = model_from_hf_config(edited(tmp_path, "Qwen__Qwen3-235B-A22B", mlp_only_layers=[0, 1]))
    assert "2 dense layer(s) (12288 wide)" in dense_qwen.note
    tied = model_from_hf_config(edited(tmp_path, "meta-llama__Meta-Llama-3-70B", tie_word_embeddings=True))
    assert "tied" in tied.note
    nested = tmp_path / "vlm.json"
    nested.write_text(json.dumps({"model_type": "llava", "text_config": json.loads(sample(
        "meta-llama__Meta-Llama-3-70B").read_text())}))
    assert shape(model_from_hf_config(nested)) == shape(model_preset("llama3-70b"))


@pytest.mark.parametrize("text, says", [("{", "not valid JSON"), ("[1, 2]", "holds a list"),
                                        (b"\xff\xfe{", "cannot be read as text")])
def test_a_file_that_is_no_config_is_refused_with_its_name(tmp_path, text, says):
    path = tmp_path / "bad.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=says) as err:
        model_from_hf_config(path)
    assert str(path) in str(err.value)


def test_the_command_line_reads_a_config_json(capsys):
    base = ["--gpus", "64", "--seq", "4096", "--batch-tokens", "2M", "--dims",
            "dp=4,tp=8,pp=2,zero_stage=1,sequence_parallel=true,micro_batches=128,recompute=selective"]
    assert cli(base + ["--model", str(sample("meta-llama__Meta-Llama-3-70B")), "--json"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    assert cli(base + ["--model", "llama3-70b", "--json"]) == 0
    from_preset = json.loads(capsys.readouterr().out)
    assert from_file["step_time"] == from_preset["step_time"] and from_file["memory_peak"] == from_preset["memory_peak"]
    assert cli(base + ["--model", "missing/config.json"]) == 2
    assert capsys.readouterr().err.strip() == ("python -m emulator.planner: --model missing/config.json: no such file "
                                               "(a value ending in .json is read as a Hugging Face config.json)")
