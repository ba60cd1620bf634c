"""The simulated trtllm-serve driven by real clients: the ``openai`` package, curl-like HTTP, and NVIDIA's aiperf.

aiperf is found through ``$KVSIM_AIPERF`` (path to its executable) or PATH; without it that test is skipped with
the reason. It runs offline with a word-level tokenizer written on the spot (tests/kvsim/clients).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .helpers import built_engine_dir
from .serve_process import KVSIM, free_port, http_status, serve

EXTRA = """return_perf_metrics: true
kv_cache_config: {free_gpu_memory_fraction: 0.9, enable_block_reuse: true}
"""


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    return built_engine_dir(tmp_path_factory.mktemp("engine"), EXTRA)


@pytest.fixture(scope="module")
def server(engine_dir):
    args = [str(engine_dir / "engine"), "--backend", "tensorrt", "--max_batch_size", "8",
            "--extra_llm_api_options", str(engine_dir / "extra.yaml")]
    with serve(args, env={"KVSIM_SPEEDUP": "5", "KVSIM_TRTLLM_RELEASE": "1.3"}) as (base, _process):
        yield base


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def test_models_version_and_health(server):
    assert get_json(server + "/version") == {"version": "1.3.0rc20"}
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == ["engine"]
    assert http_status(server + "/health") == 200


def test_openai_completion_and_chat(server):
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused")
    done = client.completions.create(model="engine", prompt="The paged KV cache holds blocks of tokens.", max_tokens=7)
    assert done.choices[0].finish_reason == "length"
    assert done.usage.completion_tokens == 7 and len(done.choices[0].text.split()) == 7
    assert done.usage.prompt_tokens == 10  # BOS + 8 words + "."
    chat = client.chat.completions.create(model="engine", max_completion_tokens=5,
                                          messages=[{"role": "user", "content": "hello there"}])
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens == 5
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + 5


def test_openai_streaming_with_usage(server):
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused")
    stream = client.chat.completions.create(model="engine", max_tokens=40, stream=True,
                                            stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": "stream please " * 50}])
    text, usage, chunks = "", None, 0
    for chunk in stream:
        chunks += 1
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
    assert usage is not None and usage.completion_tokens == 40 and len(text.split()) == 40
    assert chunks >= 4  # role chunk, several content chunks, final chunk, usage chunk
    plain = client.completions.create(model="engine", prompt=[1, 2, 3, 4], max_tokens=12, stream=True)
    assert len("".join(c.choices[0].text for c in plain if c.choices).split()) == 12


def test_concurrent_clients_respect_max_batch_size_and_metrics_drain(server):
    get_json(server + "/metrics")  # drain whatever earlier tests left

    async def burst():
        client = openai.AsyncOpenAI(base_url=server + "/v1", api_key="unused")
        calls = [client.completions.create(model="engine", prompt="word " * 300, max_tokens=60) for _ in range(24)]
        return await asyncio.gather(*calls)

    results = asyncio.run(burst())
    assert all(r.usage.completion_tokens == 60 for r in results)
    stats = get_json(server + "/metrics")
    assert stats and all(s["numActiveRequests"] <= 8 and s["maxBatchSizeStatic"] == 8 for s in stats)
    assert max(s["inflightBatchingStats"]["numScheduledRequests"] for s in stats) == 8
    assert any(s["numQueuedRequests"] > 0 for s in stats)
    kv = stats[-1]["kvCacheStats"]
    assert kv["freeNumBlocks"] + kv["usedNumBlocks"] == kv["maxNumBlocks"] and kv["tokensPerBlock"] == 32
    assert get_json(server + "/metrics") == []  # drained on read, nothing ran since


def test_prometheus_names(server):
    with urllib.request.urlopen(server + "/prometheus/metrics", timeout=5) as r:
        families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    for name in ("trtllm_kv_cache_utilization", "trtllm_kv_cache_used_blocks", "trtllm_kv_cache_max_blocks",
                 "trtllm_num_requests_running", "trtllm_num_requests_waiting", "trtllm_num_paused_requests",
                 "trtllm_max_batch_size_runtime", "trtllm_max_batch_size_static", "trtllm_time_to_first_token_seconds",
                 "trtllm_time_per_output_token_seconds", "trtllm_e2e_request_latency_seconds"):
        assert name in families, name
    assert families["trtllm_max_batch_size_static"].samples[0].value == 8
    ttft_count = [s for s in families["trtllm_time_to_first_token_seconds"].samples if s.name.endswith("_count")]
    assert ttft_count[0].value >= 1


def test_too_long_prompt_is_a_bad_request(server):
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="maximum input length"):
        client.completions.create(model="engine", prompt=list(range(5000)), max_tokens=1)


def test_refusal_exits_one_and_startup_refuses_connections(engine_dir):
    proc = subprocess.run([KVSIM, "trtllm-serve", str(engine_dir / "engine"), "--backend", "tensorrt"],
                          env={**os.environ, "KVSIM_PROFILE": "llama-3.1-8b-fp8-h100", "KVSIM_TRTLLM_RELEASE": "1.1"},
                          capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1
    assert "max_batch_size [2048] is greater than build_config.max_batch_size [64]" in proc.stderr
    port = free_port()
    slow = subprocess.Popen([KVSIM, "trtllm-serve", "meta-llama/Llama-3.1-8B-Instruct", "--host", "127.0.0.1",
                             "--port", str(port), "--max_batch_size", "16"],
                            # x100: the simulated download and autotuning of an HF id take well under a second
                            env={**os.environ, "KVSIM_PROFILE": "llama-3.1-8b-fp8-h100", "KVSIM_STARTUP_SECONDS": "2",
                                 "KVSIM_SPEEDUP": "100"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.8)
        assert http_status(f"http://127.0.0.1:{port}/health") is None  # loading: connection refused
        deadline = time.monotonic() + 20
        while http_status(f"http://127.0.0.1:{port}/health") != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert http_status(f"http://127.0.0.1:{port}/prometheus/metrics") == 404  # return_perf_metrics is off
    finally:
        slow.terminate()
        assert slow.wait(timeout=10) == 0  # graceful shutdown on SIGTERM


def _aiperf() -> str | None:
    return os.environ.get("KVSIM_AIPERF") or shutil.which("aiperf")


@pytest.mark.slow
@pytest.mark.skipif(_aiperf() is None, reason="aiperf not installed: pip install aiperf (0.13 works on Python 3.11) "
                                               "into any virtualenv and set KVSIM_AIPERF to its executable")
def test_aiperf_profiles_the_simulated_server(server, tmp_path):
    aiperf = _aiperf()
    python = Path(aiperf).with_name("python")
    corpus = next(Path(python.parent.parent).glob("lib/python*/site-packages/aiperf/dataset/generator/assets/*.txt"),
                  None)
    tokenizer = tmp_path / "tokenizer"
    helper = Path(__file__).parent / "clients" / "make_word_tokenizer.py"
    subprocess.run([str(python), str(helper), str(tokenizer)] + ([str(corpus)] if corpus else []), check=True,
                   timeout=120)
    artifacts = tmp_path / "artifacts"
    proc = subprocess.run([aiperf, "profile", "--model", "engine", "--tokenizer", str(tokenizer), "--url", server,
                           "--endpoint-type", "chat", "--streaming", "--concurrency", "6", "--request-count", "30",
                           "--synthetic-input-tokens-mean", "300", "--output-tokens-mean", "40", "--ui-type", "none",
                           "--random-seed", "7", "--artifact-dir", str(artifacts)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((artifacts / "profile_export_aiperf.json").read_text())
    text = json.dumps(doc)
    assert '"request_count"' in text
    assert doc["request_count"]["avg"] == 30
    assert doc["output_sequence_length"]["avg"] == pytest.approx(40, abs=1)
    assert doc["input_sequence_length"]["avg"] == pytest.approx(300, rel=0.05)
    assert doc.get("error_request_count", {"avg": 0})["avg"] == 0
