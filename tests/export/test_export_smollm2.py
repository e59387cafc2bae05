"""Export round trips on SmolLM2-135M-Instruct (the built-in model): hf-fp8 and hf-bf16.

The "run" is a checkpoint of perturbed SmolLM2 master weights (a stand-in for trained weights,
so the exported codes differ from a fresh quantization of the original model), written by the
same ``write_checkpoint`` the driver uses, with the first and last blocks kept in BF16.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from fp8rl.protocol import JobSpec
from fp8rl.services.checkpoint import write_checkpoint, write_model_shards
from fp8rl.services.export import export_checkpoint
from fp8rl.workers.model.build import build_decoder, layer_precision
from fp8rl.workers.model.fp8_checkpoint import (
    PARTIAL_BLOCKS_FILE,
    build_block_fp8_decoder,
    dequantize,
)
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.model.loading import load_hf_dir, resolve_model
from fp8rl.workers.weight_sync.object_store import ObjectStoreTransport
from fp8rl.workers.weight_sync.receiver import WeightReceiver
from fp8rl.workers.weight_sync.update import build_update

TOKENS = [1, 9690, 314, 216, 28, 1789, 30, 2]
MAX_POSITIONS = 64


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    try:
        source = resolve_model("builtin:smollm2-135m-instruct")
    except FileNotFoundError as error:
        pytest.skip(str(error))
    job = JobSpec(
        name="smol",
        model={"path": "builtin:smollm2-135m-instruct", "max_model_len": MAX_POSITIONS},
        data={"max_prompt_tokens": 32},
        rollout={"max_tokens": 16},
        precision={
            "mode": "unified_fp8",
            "exact": True,
            "quant": {"bf16_first_blocks": 1, "bf16_last_blocks": 1},
        },
    )
    gen = torch.Generator().manual_seed(0)
    weights = {
        k: (v.float() * (1 + 1e-2 * torch.randn(v.shape, generator=gen))).contiguous()
        for k, v in source.state_dict.items()
    }
    run_dir = tmp_path_factory.mktemp("smol")
    write_checkpoint(
        run_dir / "checkpoints",
        step=5,
        job=job,
        write_trainer=lambda d: write_model_shards(d, weights),
        policy_version=10,
        data_cursor={},
        model_config=source.config.to_dict(),
        tokenizer_dir=source.tokenizer_dir,
    )
    return run_dir, job, source, weights


@pytest.fixture(scope="module")
def fp8_export(smollm2, tmp_path_factory):
    return export_checkpoint(smollm2[0], fmt="hf-fp8", out=tmp_path_factory.mktemp("x") / "fp8")


@pytest.fixture(scope="module")
def bf16_export(smollm2, tmp_path_factory):
    return export_checkpoint(smollm2[0], fmt="hf-bf16", out=tmp_path_factory.mktemp("x") / "bf16")


def logits(model) -> torch.Tensor:
    ids = torch.tensor([TOKENS])
    with torch.no_grad():
        hidden = model(ids, torch.arange(len(TOKENS))[None], torch.tensor([len(TOKENS)]))
        return model.logits(hidden).float()


def final_policy_engine(job, source, weights):
    """A rollout engine as the run leaves it: initial weights, then the trainer's last update."""
    trainer_lp = layer_precision(job.model, job.precision, role="trainer", trainable=True)
    trainer = build_decoder(
        source.config,
        trainer_lp,
        state_dict=weights,
        max_positions=MAX_POSITIONS,
        param_dtype=torch.float32,
    )
    engine_lp = layer_precision(job.model, job.precision, role="rollout", trainable=False)
    engine = build_decoder(
        source.config,
        engine_lp,
        state_dict=source.state_dict,
        max_positions=MAX_POSITIONS,
        param_dtype=torch.bfloat16,
    )
    fingerprint = job.precision.quant.fingerprint()
    update, payload = build_update(trainer, receiver=engine_lp, version=10, fingerprint=fingerprint)
    handle = ObjectStoreTransport().send(payload)
    WeightReceiver(engine_lp, fingerprint).apply(engine, update, handle, device=torch.device("cpu"))
    return engine


@pytest.mark.slow
def test_hf_fp8_export_reproduces_the_final_policy_logits_bit_for_bit(smollm2, fp8_export):
    _, job, source, weights = smollm2
    out = fp8_export
    loaded = build_block_fp8_decoder(
        out, quant=job.precision.quant, exact=True, max_positions=MAX_POSITIONS
    )
    assert torch.equal(logits(loaded), logits(final_policy_engine(job, source, weights)))


def test_hf_fp8_export_has_the_block_fp8_layout_with_bf16_kept_modules(smollm2, fp8_export):
    source, out = smollm2[2], fp8_export
    config = json.loads((out / "config.json").read_text())
    quant = config["quantization_config"]
    assert {
        k: quant[k] for k in ("quant_method", "fmt", "weight_block_size", "activation_scheme")
    } == {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "weight_block_size": [128, 128],
        "activation_scheme": "dynamic",
    }
    last = source.config.num_hidden_layers - 1
    kept = {
        f"model.layers.{i}.{m}"
        for i in (0, last)
        for m in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    }
    # every other SmolLM2 linear (576 / 192 / 1536 wide) has partial 128-blocks: BF16 for the
    # HF/vLLM loaders, exact codes in the side file
    partial = {
        f"model.layers.{i}.{m}"
        for i in range(1, last)
        for m in ("self_attn.q_proj", "self_attn.k_proj", "mlp.down_proj")
    }
    assert partial < set(quant["modules_to_not_convert"]) and kept < set(
        quant["modules_to_not_convert"]
    )
    tensors = load_file(out / "model.safetensors")
    assert not any(k.endswith("weight_scale_inv") for k in tensors)
    codes = load_file(out / PARTIAL_BLOCKS_FILE)
    k_proj = "model.layers.1.self_attn.k_proj"  # [192, 576]: partial 128-blocks both ways
    assert codes[f"{k_proj}.weight"].dtype == torch.float8_e4m3fn
    assert tuple(codes[f"{k_proj}.weight_scale_inv"].shape) == (2, 5)
    stored = tensors[f"{k_proj}.weight"]
    assert stored.dtype == torch.bfloat16  # the codes' values, rounded once to BF16
    exact = dequantize(
        codes[f"{k_proj}.weight"], codes[f"{k_proj}.weight_scale_inv"], block=(128, 128)
    )
    assert torch.equal(stored, exact.to(torch.bfloat16))
    for name in kept:
        assert tensors[f"{name}.weight"].dtype == torch.bfloat16
        assert f"{name}.weight" not in codes
    assert tensors["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert "lm_head.weight" not in tensors  # tied embeddings, as in the HF original
    for file in ("tokenizer.json", "chat_template.jinja", "fp8rl_export.json"):
        assert (out / file).exists()


def test_hf_bf16_export_gives_the_bf16_models_logits_bit_for_bit(smollm2, bf16_export):
    _, _, source, weights = smollm2
    out = bf16_export
    bf16 = LayerPrecision(dtype=torch.bfloat16, fp8=False, exact=True, trainable=False)

    def build(state):
        return build_decoder(
            source.config,
            bf16,
            state_dict=state,
            max_positions=MAX_POSITIONS,
            param_dtype=torch.bfloat16,
        )

    assert torch.equal(logits(build(load_hf_dir(out).state_dict)), logits(build(weights)))
    assert "quantization_config" not in json.loads((out / "config.json").read_text())


def test_transformers_loads_the_hf_bf16_export_with_close_logits(smollm2, bf16_export):
    transformers = pytest.importorskip("transformers")
    source, out = smollm2[2], bf16_export
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template  # the chat template travelled with the export
    with torch.no_grad():
        theirs = model(torch.tensor([TOKENS])).logits.float()
    fp32 = LayerPrecision(dtype=torch.float32, fp8=False, trainable=False)
    ours = logits(
        build_decoder(
            source.config,
            fp32,
            state_dict=load_hf_dir(out).state_dict,
            max_positions=MAX_POSITIONS,
            param_dtype=torch.float32,
        )
    )
    assert torch.allclose(theirs, ours, atol=1e-3, rtol=1e-4), (theirs - ours).abs().max()
    original = build_decoder(
        source.config,
        fp32,
        state_dict=source.state_dict,
        max_positions=MAX_POSITIONS,
        param_dtype=torch.float32,
    )
    assert not torch.allclose(
        theirs, logits(original), atol=1e-3
    )  # the trained weights, not the source


def test_transformers_loads_the_hf_fp8_export_close_to_the_fp8_engine(smollm2, fp8_export):
    """Plain transformers on CPU: the FP8-coded layers dequantize (here: every linear of
    SmolLM2 is stored as BF16 values of its codes), activations stay unquantized. Bound: the
    max |Δlogit| against fp8rl's FP8 engine (activation quantization + BF16 rounding) stays
    below 5 % of the logit range, and the top token agrees at most positions."""
    transformers = pytest.importorskip("transformers")
    job = smollm2[1]
    model = transformers.AutoModelForCausalLM.from_pretrained(fp8_export, dtype=torch.float32)
    with torch.no_grad():
        theirs = model(torch.tensor([TOKENS])).logits.float()[0]
    ours = logits(
        build_block_fp8_decoder(
            fp8_export, quant=job.precision.quant, exact=True, max_positions=MAX_POSITIONS
        )
    )[0]
    span = float(ours.max() - ours.min())
    gap = float((theirs - ours).abs().max())
    assert gap < 0.05 * span, (gap, span)
    agree = (theirs.argmax(-1) == ours.argmax(-1)).float().mean()
    assert agree >= 0.75, agree
