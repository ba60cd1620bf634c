"""Every rendered TensorRT-LLM command uses only options its real parser has (options/*.yaml)."""

from __future__ import annotations

import itertools

import pytest
import yaml

from kvpilot.trtllm import options
from kvpilot.trtllm.build import Command
from kvpilot.trtllm.build_script import build_commands, build_script
from kvpilot.trtllm.serve import ServedEngine, llm_api_options, serve_command
from tests.unit.helpers import engine

BLOG_FLAGS = options.load("trtllm-build").not_options  # the blog's flags, from the parser data
VARIANTS = [
    dict(backend=b, model__architecture=a, build__quantization=q, build__kvCacheDtype=k)
    for b, a, q, k in itertools.product(
        ("tensorrt",), ("llama", "mistral", "mixtral", "qwen", "gemma"),
        ("none", "fp8", "int4_awq", "int8_weight_only", "nvfp4"), ("auto", "fp8"))
] + [dict(backend="simulated"), dict(backend="tensorrt", model__source="pvc://models/llama"),
     dict(backend="tensorrt", model__source="s3://bucket/llama")]
ENGINE = ServedEngine("f" * 64, 512, 8192, 1, 1)


def _commands(variant: dict) -> list[Command]:
    e = engine(**variant)
    cmds = build_commands(e.spec, "f" * 64, e.spec.build.max_batch_size) if e.spec.builds_engine else []
    return cmds + [serve_command(e.spec, ENGINE if e.spec.builds_engine else None, 64)]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(str(x) for x in v.values()))
def test_rendered_flags_exist_in_the_real_parsers(variant: dict) -> None:
    for cmd in _commands(variant):
        assert options.check(cmd) == [], cmd.argv


def test_pytorch_serve_flags_exist() -> None:
    cmd = serve_command(engine("pytorch").spec, None, 64)
    assert options.check(cmd) == []
    assert cmd.argv[1] == "meta-llama/Llama-3.1-8B-Instruct" and "--revision" in cmd.argv


def test_checker_rejects_blog_flags_and_bad_values() -> None:
    for flag in BLOG_FLAGS:
        assert options.check(Command("trtllm-build", ("trtllm-build", flag, "1")))
    assert options.check(Command("trtllm-build", ("trtllm-build", "--multiple_profiles")))  # needs enable|disable
    assert options.check(Command("trtllm-build", ("trtllm-build", "--kv_cache_type", "paged_blocks")))
    assert options.check(Command("trtllm-serve", ("trtllm-serve", "m", "--backend", "onnx")))


def test_flags_the_parsers_lack_are_never_rendered() -> None:
    """The parsers' not_options (the blog's in-flight-batching and paged-KV flags among them) never appear."""
    build_missing = set(BLOG_FLAGS)
    serve_missing = set(options.load("trtllm-serve").not_options)
    for variant in VARIANTS:
        for cmd in _commands(variant):
            missing = build_missing if cmd.tool == "trtllm-build" else serve_missing if cmd.tool == "trtllm-serve" else set()
            assert not missing & set(cmd.argv), cmd.argv


def test_build_expresses_inflight_batching_with_real_flags() -> None:
    argv = build_commands(engine("tensorrt").spec, "f" * 64, 512)[-1].argv
    pairs = dict(zip(argv[1::2], argv[2::2]))
    assert pairs["--kv_cache_type"] == "paged"
    assert pairs["--remove_input_padding"] == "enable"
    assert pairs["--gpt_attention_plugin"] == "auto"
    assert pairs["--use_paged_context_fmha"] == "enable"
    assert pairs["--max_batch_size"] == "512" and pairs["--tokens_per_block"] == "32"


@pytest.mark.parametrize("quant,expected", [("none", "auto"), ("int4_awq", "auto"), ("fp8", "disable")])
def test_gemm_plugin_follows_nvidia_advice(quant: str, expected: str) -> None:
    argv = build_commands(engine("tensorrt", build__quantization=quant).spec, "f" * 64, 512)[-1].argv
    assert argv[argv.index("--gemm_plugin") + 1] == expected


def test_serve_always_passes_a_batch_size_within_the_engine() -> None:
    cmd = serve_command(engine("tensorrt").spec, ServedEngine("f" * 64, 32, 4096, 1, 1), 64)
    assert cmd.argv[cmd.argv.index("--max_batch_size") + 1] == "32"
    assert cmd.argv[cmd.argv.index("--max_num_tokens") + 1] == "4096"


def test_quantized_builds_use_modelopt_with_calibration() -> None:
    spec = engine("tensorrt", build__quantization="fp8", build__calibration={"dataset": "pvc://m/data"},
                  model__source="pvc://m/llama").spec
    argv = build_commands(spec, "f" * 64, 512)[0].argv
    assert argv[1].endswith("/quantization/quantize.py")
    assert argv[argv.index("--calib_dataset") + 1] == "/calibration/data"  # air-gapped: read from its own claim


@pytest.mark.parametrize("quant,kv,qformat", [("fp8", "auto", "fp8"), ("int4_awq", "auto", "int4_awq"),
                                             ("nvfp4", "auto", "nvfp4"), ("int8_weight_only", "fp8", "int8_wo"),
                                             ("none", "fp8", "full_prec")])
def test_modelopt_qformat_is_the_quantization_asked_for(quant: str, kv: str, qformat: str) -> None:
    argv = build_commands(engine("tensorrt", build__quantization=quant, build__kvCacheDtype=kv).spec, "f" * 64,
                          512)[1].argv
    assert argv[argv.index("--qformat") + 1] == qformat


def _yaml_keys_allowed(options_doc: dict, backend: str) -> None:
    spec_keys = yaml.safe_load(
        (options.resources.files("kvpilot.trtllm") / "options" / "llm_api_options.yaml").read_text())
    top = spec_keys["top_level"]
    for key in options_doc:
        assert key in top and backend in top[key]["backends"], key
    for key in options_doc["kv_cache_config"]:
        assert key in spec_keys["kv_cache_config"], key
    for key in options_doc["scheduler_config"]:
        assert key in spec_keys["scheduler_config"], key
    for key in options_doc.get("cuda_graph_config", {}):
        assert key in spec_keys["cuda_graph_config"], key
    if backend == "tensorrt":
        assert set(options_doc["scheduler_config"]["dynamic_batch_config"]) == set(spec_keys["dynamic_batch_config"])


@pytest.mark.parametrize("backend", ["tensorrt", "pytorch"])
def test_llm_api_yaml_uses_only_keys_the_backend_accepts(backend: str) -> None:
    doc = llm_api_options(engine(backend).spec, ENGINE if backend == "tensorrt" else None, 64)
    _yaml_keys_allowed(doc, backend)
    assert ("enable_iter_perf_stats" in doc) == (backend == "pytorch")
    # Each backend gets only what it uses: the in-engine batch tuner on TensorRT, CUDA graphs on PyTorch.
    assert ("dynamic_batch_config" in doc["scheduler_config"]) == (backend == "tensorrt")
    assert ("cuda_graph_config" in doc) == (backend == "pytorch")


def test_script_publishes_atomically_and_checks_the_cache_first() -> None:
    script = build_script(engine("tensorrt").spec, "a" * 64, "img", 512)
    assert script.index("kvpilot-engine.json ]; then") < script.index("trtllm-build")
    assert 'mv -T "$STAGE" /engines/' + "a" * 64 in script


def test_pytorch_gets_its_kv_block_size_at_runtime_and_tensorrt_bakes_it_into_the_engine() -> None:
    custom = {"type": "paged", "tokensPerBlock": 64}
    torch = llm_api_options(engine("pytorch", build__kvCache=custom).spec, None, 64)
    assert torch["kv_cache_config"]["tokens_per_block"] == 64
    assert "tokens_per_block" not in llm_api_options(engine("pytorch").spec, None, 64)["kv_cache_config"]  # 32
    trt = llm_api_options(engine("tensorrt", build__kvCache=custom).spec, ENGINE, 64)
    assert "tokens_per_block" not in trt["kv_cache_config"]
