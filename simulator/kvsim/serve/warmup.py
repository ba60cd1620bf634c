"""What a PyTorch trtllm-serve does at start besides loading: the per-pod checkpoint download and the kernel
autotuner's warm-up, which loads and saves its cache at ``TLLM_AUTOTUNER_CACHE_PATH``.

TensorRT-LLM, read in its source (index file versions; no release tag confirmed):

- ``PyTorchModelEngine._run_autotuner_warmup`` (tensorrt_llm/_torch/pyexecutor/model_engine.py, index id 707893322):
  only with ``enable_autotuner`` (TorchLlmArgs, default on); ``cache_path = os.environ.get(
  "TLLM_AUTOTUNER_CACHE_PATH", None)``, then ``with autotune(cache_path=cache_path, ...)`` one warm-up forward of
  ``min(available KV tokens, max_num_tokens, batch_size * (max_seq_len - 1))`` tokens.
- ``autotune`` (tensorrt_llm/_torch/autotuner.py, index id 3648310208): when the file exists it is loaded
  (``load_cache(path, rank)``: the ``metadata`` object and this rank's ``rank_<N>`` section; a file that is not
  JSON or lacks the rank's section raises: "[AutoTuner] Failed to load cache with JSON"), tuning then profiles
  only the shapes the cache lacks (``choose_one`` skips a ``search_cache`` hit), and at the end
  ``save_cache(path, rank)`` creates the parent directory, opens the file ``a+`` under ``flock``, keeps the other
  ranks' sections and replaces its own; a failed write raises ("Failed to save cache with JSON"), so the server
  does not start. The dynamic token dimension is tuned on power-of-two buckets from
  ``next_positive_power_of_2(n)`` down to 1 (``get_power_of_2_num_tokens_buckets``,
  tensorrt_llm/_torch/utils.py, index id 31509507578). An older layout (id 1046802610: one
  ``<name>.rank<N>.json`` per rank) is not played; kvsim's ``prepare`` writes the newer one.
- A model given as a Hugging Face id (no local directory) is downloaded by the pod itself before it loads.

kvsim's assumptions (stated, NOT measured; simulated seconds, divided by ``KVSIM_SPEEDUP`` like the CUDA-graph
capture):

- ``AUTOTUNE_SECONDS_PER_BUCKET``: profiling one token bucket (every tunable op's tactics for that shape);
- ``DOWNLOAD_BYTES_PER_S``: the pod's download rate of the checkpoint's weights (the profile's, all ranks).
kvsim models no tactics: its cache entries name the bucket a rank tuned (``kvsim::warmup``), and entries it does
not recognise (a real TensorRT-LLM cache) are kept as they are.
"""

from __future__ import annotations

import ast
import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CACHE_ENV = "TLLM_AUTOTUNER_CACHE_PATH"
AUTOTUNE_SECONDS_PER_BUCKET = 1.0  # assumption, see the module docstring
DOWNLOAD_BYTES_PER_S = 500e6  # assumption: 500 MB/s
MAX_CACHE_BYTES = 64 << 20  # a bigger file is not an autotuner cache
OP = "kvsim::warmup"


class AutotuneCacheError(ValueError):
    """The cache at TLLM_AUTOTUNER_CACHE_PATH cannot be loaded or saved: trtllm-serve raises and does not start."""


def token_buckets(num_tokens: int) -> tuple[int, ...]:
    """get_power_of_2_num_tokens_buckets: next_positive_power_of_2(n) down to 1, ascending here."""
    top = 1 << max(0, int(num_tokens) - 1).bit_length() if num_tokens > 1 else 1
    return tuple(1 << i for i in range(top.bit_length()))


def warmup_tokens(max_num_tokens: int, max_batch_size: int, max_seq_len: int, kv_tokens: int) -> int:
    """The warm-up forward's token count (``_run_autotuner_warmup``'s curr_max_num_tokens)."""
    return max(1, min(kv_tokens, max_num_tokens, max_batch_size * (max_seq_len - 1)))


def _key(bucket: int) -> str:
    return str((OP, "KvsimRunner", "()", ((bucket,),)))


def _bucket_of(key: str) -> int | None:
    """The bucket a kvsim entry names; None for anything else (a real tactic entry, a malformed key)."""
    try:
        parsed = ast.literal_eval(key) if len(key) < 400 else None
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(parsed, tuple) and len(parsed) == 4 and parsed[0] == OP:
        shape = parsed[3]
        if isinstance(shape, tuple) and shape and isinstance(shape[0], tuple) and shape[0] and \
                isinstance(shape[0][0], int) and not isinstance(shape[0][0], bool):
            return shape[0][0]
    return None


def _load(path: Path, ranks: int) -> dict[str, Any]:
    """The cache file's content, each rank's section checked (load_cache raises where these fail)."""
    try:
        if path.stat().st_size > MAX_CACHE_BYTES:
            raise AutotuneCacheError(f"[AutoTuner] Failed to load cache with JSON: {path} is larger than "
                                     f"{MAX_CACHE_BYTES >> 20} MiB")
        content = json.loads(path.read_text())
    except AutotuneCacheError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise AutotuneCacheError(f"[AutoTuner] Failed to load cache with JSON: {path}: {str(exc)[:200]}") from None
    if not isinstance(content, dict) or not isinstance(content.get("metadata"), dict):
        raise AutotuneCacheError(f"[AutoTuner] Failed to load cache with JSON: {path} has no 'metadata' object")
    for rank in range(ranks):
        if not isinstance(content.get(f"rank_{rank}"), dict):
            raise AutotuneCacheError(f"[AutoTuner] Failed to load cache with JSON: Rank {rank} cache not found "
                                     f"in {path}")
    return content


@dataclass(frozen=True)
class Autotune:
    """One start's autotuner warm-up: the buckets tuned and found in the cache (per rank, the slowest rank's
    count: ranks tune at once), the simulated seconds it took, and the log lines trtllm-serve prints."""

    tuned: int
    cached: int
    seconds: float
    log: tuple[str, ...]


def autotune(num_tokens: int, ranks: int, path: str | None, version: str, gpu: str) -> Autotune:
    """Load the cache (if any), tune the buckets it lacks, save it back; AutotuneCacheError as the real one
    raises. ``path``: TLLM_AUTOTUNER_CACHE_PATH (None: tune everything, write nothing)."""
    wanted = token_buckets(num_tokens)
    log: list[str] = []
    if not path:
        seconds = len(wanted) * AUTOTUNE_SECONDS_PER_BUCKET
        return Autotune(len(wanted), 0, seconds, ("[Autotuner] Autotuning process starts ...",
                                                  "[Autotuner] Autotuning process ends"))
    file = Path(path)
    content: dict[str, Any] = {}
    if file.exists():
        log.append(f"[Autotuner] Loading cache from {file}")
        content = _load(file, ranks)
    missing = max(sum(1 for b in wanted if b not in _buckets(content.get(f"rank_{r}", {}))) for r in range(ranks))
    log += ["[Autotuner] Autotuning process starts ...", "[Autotuner] Autotuning process ends"]
    _save(file, ranks, wanted, version, gpu)
    log.append(f"[AutoTuner] Successfully saved cache to {file} using JSON format")
    return Autotune(missing, len(wanted) - missing, missing * AUTOTUNE_SECONDS_PER_BUCKET, tuple(log))


def _buckets(section: Any) -> set[int]:
    return {b for k in section if isinstance(k, str) and (b := _bucket_of(k)) is not None} \
        if isinstance(section, dict) else set()


def _save(file: Path, ranks: int, tuned: tuple[int, ...], version: str, gpu: str) -> None:
    """save_cache for every rank kvsim plays: under flock, metadata kept (or written), each rank's section the
    loaded one plus what was tuned."""
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        with open(file, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            text = f.read(MAX_CACHE_BYTES + 1)
            current = json.loads(text) if text.strip() else {}
            if not isinstance(current, dict):
                current = {}
            if not isinstance(current.get("metadata"), dict):
                current["metadata"] = {"lib_version": version, "creation_timestamp": time.time(),
                                       "device_name": gpu, "device_capability": None, "producer": "kvsim"}
            for rank in range(ranks):
                section = current.get(f"rank_{rank}")
                section = dict(section) if isinstance(section, dict) else {}
                for bucket in tuned:
                    section.setdefault(_key(bucket), {"runner_id": 0, "tactic": "-1", "min_time": 0.0})
                current[f"rank_{rank}"] = section
            f.seek(0)
            f.truncate()
            json.dump(current, f, indent=2)
    except (OSError, ValueError, RecursionError) as exc:
        raise AutotuneCacheError(f"[AutoTuner] Failed to save cache with JSON: {file}: {str(exc)[:200]}") from None


def downloads(model: str) -> bool:
    """Whether the pod fetches the checkpoint itself: the model is not a local directory (a Hugging Face id)."""
    return not Path(model).is_dir()


def download_seconds(checkpoint_bytes: float) -> float:
    return checkpoint_bytes / DOWNLOAD_BYTES_PER_S


def cache_path(env: os._Environ[str] | dict[str, str]) -> str | None:
    return env.get(CACHE_ENV) or None


def start(settings: Any, env: Any, log: Any, sleep: Any = time.sleep) -> None:
    """The PyTorch backend's start before the CUDA graphs: download (an HF id), load, autotune. ``settings``: the
    ServeSettings; ``log``/``sleep`` injected (the CLI's logger and time.sleep). AutotuneCacheError: exit 1."""
    from ..memory import plan_for

    cfg = settings.engine
    profile = cfg.resolved_profile
    torch = settings.backend != "tensorrt"
    if torch and downloads(settings.model):
        seconds = download_seconds(profile.weights_resident_bytes * profile.num_gpus)
        log(f"kvsim downloads {settings.model}: {profile.weights_resident_bytes * profile.num_gpus / 1e9:.1f} GB at "
            f"{DOWNLOAD_BYTES_PER_S / 1e6:g} MB/s, {seconds:.1f} s (simulated, x{settings.speedup:g})")
        sleep(seconds / settings.speedup)
    log(f"Loading model {settings.model} (simulated, {settings.startup_s:g} s)")
    sleep(settings.startup_s)  # bound but not listening: connections are refused, as during a real load
    if not torch or not settings.enable_autotuner:
        return
    tokens = warmup_tokens(cfg.max_num_tokens, cfg.max_batch_size, cfg.max_seq_len, plan_for(cfg).kv_tokens)
    tuned = autotune(tokens, profile.num_gpus, cache_path(env), settings.version, profile.gpu.name)
    for line in tuned.log:
        log(line)
    log(f"kvsim autotuner warm-up ({tokens} tokens): {tuned.tuned} token buckets tuned, {tuned.cached} from the "
        f"cache, {tuned.seconds:g} s (simulated, x{settings.speedup:g})")
    sleep(tuned.seconds / settings.speedup)
