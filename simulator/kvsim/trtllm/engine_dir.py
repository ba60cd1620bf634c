"""Reading an engine directory written by (kvsim) trtllm-build: the limits trtllm-serve must respect."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from ..config import KvCacheType
from ..profiles import Profile
from ..specs import ModelSpec, dtype_key
from .checkpoint import model_spec_from_config


@dataclass(frozen=True)
class EngineDir:
    path: Path
    version: str
    model: ModelSpec
    dtype: str
    tp: int
    pp: int
    max_batch_size: int
    max_num_tokens: int
    max_seq_len: int
    max_input_len: int
    max_beam_width: int
    tokens_per_block: int
    kv_cache_type: KvCacheType

    def profile_on(self, base: Profile) -> Profile:
        """This engine's model, precision and mapping on ``base``'s GPU, with ``base``'s calibration."""
        if (self.model, self.dtype, self.tp, self.pp) == (base.model, base.dtype, base.tp, base.pp):
            return base
        name = f"{self.model.name}-{self.dtype}-{base.gpu.name}" + (f"-tp{self.tp}" if self.tp > 1 else "")
        return replace(base, name=name + (f"-pp{self.pp}" if self.pp > 1 else ""), model=self.model,
                       dtype=self.dtype, tp=self.tp, pp=self.pp)


def is_engine_dir(path: str | Path) -> bool:
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        return "build_config" in json.loads(config.read_text())
    except (OSError, json.JSONDecodeError):
        return False


def load_engine_dir(path: str | Path) -> EngineDir:
    """Parse ``path/config.json``; ValueError names what is missing."""
    root = Path(path)
    config_path = root / "config.json"
    if not config_path.is_file():
        raise ValueError(f"engine directory {root} has no config.json (build one with trtllm-build)")
    try:
        doc = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{config_path} is not JSON: {exc}") from None
    if "build_config" not in doc or "pretrained_config" not in doc:
        raise ValueError(f"{config_path} is not an engine config: it needs build_config and pretrained_config")
    build, pretrained = doc["build_config"], doc["pretrained_config"]
    plugin = build.get("plugin_config") or {}
    mapping = pretrained.get("mapping") or {}
    quant = pretrained.get("quantization") or {}
    kv_type = str(build.get("kv_cache_type", "PAGED")).lower()
    if kv_type not in ("paged", "continuous"):
        raise ValueError(f"{config_path}: build_config.kv_cache_type must be PAGED or CONTINUOUS, got {kv_type}")
    return EngineDir(
        path=root, version=str(doc.get("version", "")),
        model=model_spec_from_config(pretrained, str(config_path)),
        dtype=dtype_key(quant.get("quant_algo"), quant.get("kv_cache_quant_algo"), pretrained.get("dtype", "bfloat16")),
        tp=int(mapping.get("tp_size", 1)), pp=int(mapping.get("pp_size", 1)),
        max_batch_size=int(build["max_batch_size"]), max_num_tokens=int(build["max_num_tokens"]),
        max_seq_len=int(build["max_seq_len"]), max_input_len=int(build.get("max_input_len") or build["max_seq_len"]),
        max_beam_width=int(build.get("max_beam_width", 1)), tokens_per_block=int(plugin.get("tokens_per_block", 32)),
        kv_cache_type=KvCacheType(kv_type))
