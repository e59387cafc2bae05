"""The HF block-FP8 format (fp8_checkpoint.py) and the export command, on the tiny random Llama."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from fp8rl.kernels import per_block_quant
from fp8rl.protocol import JobSpec, QuantConfig
from fp8rl.services.checkpoint import write_checkpoint, write_model_shards
from fp8rl.services.cli import app
from fp8rl.services.export import export_checkpoint, write_safetensors
from fp8rl.workers.model.build import build_decoder, layer_precision
from fp8rl.workers.model.config import PRESETS
from fp8rl.workers.model.fp8_checkpoint import (
    block_fp8_config,
    build_block_fp8_decoder,
    dequantize,
    dequantize_if_block_fp8,
    quantize_block_fp8,
    split_block_fp8,
)
from fp8rl.workers.model.loading import load_hf_dir


def test_weight_scale_inv_is_per_block_quant_of_the_master_weight():
    w = torch.randn(200, 300, generator=torch.Generator().manual_seed(0))
    out = quantize_block_fp8({"layer.weight": w, "norm.weight": torch.ones(300)}, is_fp8=bool)
    q = per_block_quant(w)
    assert torch.equal(out["layer.weight"].view(torch.uint8), q.codes.view(torch.uint8))
    assert torch.equal(out["layer.weight_scale_inv"], q.scale)  # [2, 3]: partial edge blocks
    assert out["norm.weight"].dtype == torch.bfloat16  # 1-D tensors are never quantized
    got = dequantize(out["layer.weight"], out["layer.weight_scale_inv"], block=(128, 128))
    assert torch.equal(got, q.dequantize())


def test_dequantize_supports_other_block_shapes():
    codes = torch.randn(5, 7).clamp(-4, 4).to(torch.float8_e4m3fn)
    scale = torch.tensor([[1.0, 2.0], [4.0, 8.0], [0.5, 0.25]])  # block [2, 4] → grid [3, 2]
    dense, quantized = split_block_fp8(
        {"m.weight": codes, "m.weight_scale_inv": scale}, block=(2, 4)
    )
    assert dense == {}
    expected = codes.float() * scale.repeat_interleave(2, 0)[:5].repeat_interleave(4, 1)[:, :7]
    assert torch.equal(dequantize(*quantized["m"], block=(2, 4)), expected)


def test_malformed_fp8_tensors_are_refused_naming_the_tensor():
    codes = torch.zeros(130, 128, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"a\.weight_scale_inv is missing"):
        split_block_fp8({"a.weight": codes}, block=(128, 128))
    with pytest.raises(ValueError, match=r"a.weight_scale_inv has shape \(1, 1\).*needs \(2, 1\)"):
        split_block_fp8(
            {"a.weight": codes, "a.weight_scale_inv": torch.ones(1, 1)}, block=(128, 128)
        )
    with pytest.raises(ValueError, match="scales without FP8 weights"):
        split_block_fp8({"b.weight_scale_inv": torch.ones(1, 1)}, block=(128, 128))


def test_only_block_e4m3_fp8_configs_are_accepted():
    assert block_fp8_config({"model_type": "llama"}) is None
    assert block_fp8_config({"quantization_config": {"quant_method": "awq"}}) is None
    with pytest.raises(ValueError, match="per-tensor FP8"):
        block_fp8_config({"quantization_config": {"quant_method": "fp8"}})
    with pytest.raises(ValueError, match="fmt='e5m2'"):
        block_fp8_config(
            {
                "quantization_config": {
                    "quant_method": "fp8",
                    "fmt": "e5m2",
                    "weight_block_size": [128, 128],
                }
            }
        )
    state = {"x.weight": torch.ones(2, 2)}
    assert dequantize_if_block_fp8({"model_type": "llama"}, state) is state


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A run directory with one checkpoint of tiny-llama weights, first block kept in BF16."""
    job = JobSpec(
        name="tiny",
        model={"path": "random:tiny-llama", "max_model_len": 64},
        data={"max_prompt_tokens": 32},
        rollout={"max_tokens": 8},
        precision={"mode": "unified_fp8", "quant": {"bf16_first_blocks": 1}},
    )
    lp = layer_precision(job.model, job.precision, role="trainer", trainable=True)
    trainer = build_decoder(
        PRESETS["tiny-llama"],
        lp,
        state_dict=None,
        max_positions=64,
        param_dtype=torch.float32,
        seed=5,
    )
    weights = {k: v.detach().clone() for k, v in trainer.state_dict().items()}
    run_dir = tmp_path_factory.mktemp("tiny")
    for step in (1, 2):
        write_checkpoint(
            run_dir / "checkpoints",
            step=step,
            job=job,
            write_trainer=lambda d: write_model_shards(d, weights),
            policy_version=step,
            data_cursor={},
            model_config=PRESETS["tiny-llama"].to_dict(),
            tokenizer_dir=None,
        )
    return run_dir, job, trainer, weights


def test_export_command_writes_an_fp8_directory_our_loaders_read(tiny_run, tmp_path):
    run_dir, job, trainer, weights = tiny_run
    result = CliRunner().invoke(app, ["export", str(run_dir), "--format", "hf-fp8", "--step", "1"])
    assert result.exit_code == 0, result.output
    out = run_dir / "exports" / "hf-fp8-step_1"
    assert result.output.strip().endswith(str(out))
    provenance = json.loads((out / "fp8rl_export.json").read_text())
    assert (provenance["step"], provenance["quant_fingerprint"]) == (
        1,
        job.precision.quant.fingerprint(),
    )
    dequantized = load_hf_dir(out).state_dict  # the load_hf_dir hook
    q = trainer.model.layers[1].mlp.down_proj.quantized_weight()
    assert torch.equal(dequantized["model.layers.1.mlp.down_proj.weight"], q.dequantize())
    assert torch.equal(
        dequantized["model.layers.0.mlp.down_proj.weight"],  # BF16-kept block
        weights["model.layers.0.mlp.down_proj.weight"].to(torch.bfloat16).float(),
    )
    model = build_block_fp8_decoder(out, quant=job.precision.quant, max_positions=64)
    assert torch.equal(
        model.model.layers[1].mlp.down_proj.weight_codes.view(torch.uint8),
        q.codes.view(torch.uint8),
    )


def test_loading_fp8_codes_into_a_model_that_quantizes_a_bf16_layer_is_refused(tiny_run, tmp_path):
    run_dir, *_ = tiny_run
    result = CliRunner().invoke(
        app, ["export", str(run_dir), "--format", "hf-fp8", "--out", str(tmp_path / "e")]
    )
    assert result.exit_code == 0, result.output
    with pytest.raises(ValueError, match=r"model.layers.0.self_attn.q_proj runs FP8 .* BF16"):
        build_block_fp8_decoder(tmp_path / "e", quant=QuantConfig(), max_positions=64)


def test_export_errors_are_one_line_for_people(tiny_run, tmp_path):
    run_dir, *_ = tiny_run
    missing = CliRunner().invoke(app, ["export", str(tmp_path / "nothing"), "--format", "hf-bf16"])
    assert missing.exit_code == 2 and "no complete checkpoint" in missing.output
    step = CliRunner().invoke(app, ["export", str(run_dir), "--step", "9"])
    assert step.exit_code == 2 and "available: [1, 2]" in step.output
    bad = CliRunner().invoke(app, ["export", str(run_dir), "--format", "gguf"])
    assert bad.exit_code == 2
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # --out under a file: the target cannot be written (exit 1)
    unwritable = CliRunner().invoke(app, ["export", str(run_dir), "--out", str(blocked / "e")])
    assert unwritable.exit_code == 1 and f"cannot write the export to {blocked / 'e'}" in (
        unwritable.output
    )


def test_export_never_replaces_a_directory_that_is_not_a_previous_export(
    tiny_run, tmp_path, monkeypatch
):
    run_dir, *_ = tiny_run
    precious = tmp_path / "mine"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep")
    monkeypatch.chdir(precious)
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    for target, reason in (
        (run_dir, "would replace or write into the checkpoint"),  # the run itself
        (run_dir / "checkpoints" / "step_2" / "e", "would replace or write into the checkpoint"),
        (precious, "not an fp8rl export"),
        (Path("."), "not an fp8rl export"),  # the current directory
        (precious / "notes.txt", "is not a directory"),
    ):
        result = CliRunner().invoke(app, ["export", str(run_dir), "--out", str(target)])
        assert result.exit_code == 2 and reason in result.output, (target, result.output)
    assert (precious / "notes.txt").read_text() == "keep"
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before
    again = tmp_path / "export"
    for fmt in ("hf-bf16", "hf-fp8"):  # a previous export is replaced
        result = CliRunner().invoke(app, ["export", str(run_dir), "-f", fmt, "--out", str(again)])
        assert result.exit_code == 0, result.output
        assert json.loads((again / "fp8rl_export.json").read_text())["format"] == fmt


def test_large_exports_are_sharded_with_an_index_our_loader_reads(tiny_run, tmp_path):
    _, _, _, weights = tiny_run
    (tmp_path / "config.json").write_text(json.dumps(PRESETS["tiny-llama"].hf_config()))
    files = write_safetensors(weights, tmp_path, max_shard_bytes=2**20)
    assert len(files) > 1 and (tmp_path / "model.safetensors.index.json").exists()
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(weights)
    loaded = load_hf_dir(tmp_path).state_dict
    assert all(torch.equal(loaded[k], v) for k, v in weights.items())
    assert sum(len(load_file(tmp_path / f)) for f in files) == len(weights)


def test_fp8_kv_cache_scales_travel_in_hf_fp8_and_are_dropped_from_hf_bf16(tmp_path):
    job = JobSpec(
        name="kv",
        model={"path": "random:tiny-llama", "max_model_len": 64},
        data={"max_prompt_tokens": 32},
        rollout={"max_tokens": 8},
        precision={"mode": "unified_fp8", "quant": {"kv_cache_dtype": "fp8_e4m3"}},
    )
    lp = layer_precision(job.model, job.precision, role="trainer", trainable=True)
    trainer = build_decoder(
        PRESETS["tiny-llama"],
        lp,
        state_dict=None,
        max_positions=64,
        param_dtype=torch.float32,
        seed=5,
    )
    weights = {k: v.detach().clone() for k, v in trainer.state_dict().items()}
    assert "model.layers.1.self_attn.k_scale" in weights  # calibrated scales are model state
    weights["model.layers.1.self_attn.k_scale"].fill_(0.03125)
    write_checkpoint(
        tmp_path / "checkpoints",
        step=1,
        job=job,
        write_trainer=lambda d: write_model_shards(d, weights),
        policy_version=1,
        data_cursor={},
        model_config=PRESETS["tiny-llama"].to_dict(),
        tokenizer_dir=None,
    )
    fp8 = export_checkpoint(tmp_path, fmt="hf-fp8")
    scale = load_file(fp8 / "model.safetensors")["model.layers.1.self_attn.k_scale"]
    assert scale.dtype == torch.float32 and scale.shape == () and float(scale) == 0.03125
    model = build_block_fp8_decoder(fp8, quant=job.precision.quant, max_positions=64)
    assert float(model.model.layers[1].self_attn.k_scale) == 0.03125
    assert "model.layers.1.self_attn.k_scale" not in load_hf_dir(fp8).state_dict
    bf16 = export_checkpoint(tmp_path, fmt="hf-bf16")
    assert not any(k.endswith("_scale") for k in load_file(bf16 / "model.safetensors"))


def test_a_partial_block_member_takes_its_fused_vllm_siblings_to_bf16():
    from fp8rl.services.export import with_fused_siblings

    fp8 = {
        "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.k_proj",
        "model.layers.1.self_attn.v_proj", "model.layers.1.self_attn.o_proj",
        "model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj",
    }  # fmt: skip
    got = with_fused_siblings({"model.layers.1.self_attn.k_proj"}, fp8)
    assert got == {f"model.layers.1.self_attn.{m}" for m in ("q_proj", "k_proj", "v_proj")}
    assert with_fused_siblings({"model.layers.1.mlp.up_proj"}, fp8) == {
        "model.layers.1.mlp.gate_proj",
        "model.layers.1.mlp.up_proj",
    }


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_exported_files_follow_the_umask_not_safetensors_0600(tiny_run, tmp_path, umask):
    """Another user or a service account (a vLLM server) must be able to read an export."""
    run_dir, *_ = tiny_run
    previous = os.umask(umask)
    try:
        out = export_checkpoint(run_dir, fmt="hf-fp8", out=tmp_path / "x")
    finally:
        os.umask(previous)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [out, *out.rglob("*")]}
    assert modes["model.safetensors"] == 0o666 & ~umask
    assert modes["x"] == 0o777 & ~umask
    assert set(modes.values()) == {0o666 & ~umask, 0o777 & ~umask}, modes
