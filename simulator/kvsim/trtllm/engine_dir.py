"""Reading an engine directory written by (kvsim) trtllm-build: the limits trtllm-serve must respect."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from ..config import KvCacheType
from ..profiles import Profile
from ..specs import ModelSpec, dtype_key
from .checkpoint import config_int, model_spec_from_config, read_config_json


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
        doc = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(doc, dict) and "build_config" in doc


def load_engine_dir(path: str | Path) -> EngineDir:
    """Parse ``path/config.json``; ValueError names what is missing."""
    root = Path(path)
    config_path = root / "config.json"
    if not config_path.is_file():
        raise ValueError(f"engine directory {root} has no config.json (build one with trtllm-build)")
    doc = read_config_json(config_path, "engine config")
    if "build_config" not in doc or "pretrained_config" not in doc:
        raise ValueError(f"{config_path} is not an engine config: it needs build_config and pretrained_config")
    build, pretrained = doc["build_config"], doc["pretrained_config"]
    _object(build, f"{config_path}: build_config")
    _object(pretrained, f"{config_path}: pretrained_config")
    plugin = _object(build.get("plugin_config"), f"{config_path}: build_config.plugin_config")
    mapping = _object(pretrained.get("mapping"), f"{config_path}: pretrained_config.mapping")
    quant = _object(pretrained.get("quantization"), f"{config_path}: pretrained_config.quantization")
    where = f"{config_path}: build_config"
    kv_type = str(build.get("kv_cache_type", "PAGED")).lower()
    if kv_type not in ("paged", "continuous"):
        raise ValueError(f"{config_path}: build_config.kv_cache_type must be PAGED or CONTINUOUS, got {kv_type}")
    return EngineDir(
        path=root, version=str(doc.get("version", "")),
        model=model_spec_from_config(pretrained, str(config_path)),
        dtype=dtype_key(quant.get("quant_algo"), quant.get("kv_cache_quant_algo"), pretrained.get("dtype", "bfloat16")),
        tp=config_int(mapping, "tp_size", f"{config_path}: pretrained_config.mapping", 1),
        pp=config_int(mapping, "pp_size", f"{config_path}: pretrained_config.mapping", 1),
        max_batch_size=config_int(build, "max_batch_size", where),
        max_num_tokens=config_int(build, "max_num_tokens", where),
        max_seq_len=config_int(build, "max_seq_len", where),
        max_input_len=config_int(build, "max_input_len", where, build.get("max_seq_len")),
        max_beam_width=config_int(build, "max_beam_width", where, 1),
        tokens_per_block=config_int(plugin, "tokens_per_block", f"{where}.plugin_config", 32),
        kv_cache_type=KvCacheType(kv_type))


def _object(section: object, where: str) -> dict:
    """``section`` when it is a JSON object, {} when absent or null; ValueError naming it otherwise (the file
    is user-editable; an empty list is no more an object than a full one)."""
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise ValueError(f"{where} must be a JSON object, got {type(section).__name__}")
    return section
