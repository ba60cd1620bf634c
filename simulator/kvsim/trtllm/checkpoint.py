"""``kvsim checkpoint``: write a TensorRT-LLM checkpoint directory (config.json, no weights) for a profile.

On the simulated backend this stands in for ``convert_checkpoint.py`` / ``quantize.py``: TP/PP are chosen here,
as in TensorRT-LLM, and ``trtllm-build --checkpoint_dir`` reads the result. The fields follow TensorRT-LLM's
``PretrainedConfig`` (architecture, dtype, shapes, mapping, quantization).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..profiles import Profile, get_profile
from ..specs import MODELS, ModelSpec


def checkpoint_config(profile: Profile, tp_size: int | None = None, pp_size: int = 1) -> dict:
    """The checkpoint config.json for ``profile`` mapped on ``tp_size`` x ``pp_size`` ranks."""
    tp = tp_size or profile.tp
    m = profile.model
    return {
        "architecture": m.architecture,
        "dtype": "float16" if profile.dtype == "fp16" else "bfloat16",
        "logits_dtype": "float32",
        "vocab_size": m.vocab_size,
        "max_position_embeddings": m.max_position_embeddings,
        "hidden_size": m.hidden_size,
        "num_hidden_layers": m.num_layers,
        "num_attention_heads": m.num_heads,
        "num_key_value_heads": m.num_kv_heads,
        "head_size": m.head_dim,
        "intermediate_size": m.intermediate_size,
        "hidden_act": "silu",
        "norm_epsilon": 1e-05,
        "position_embedding_type": "rope_gpt_neox",
        "rotary_base": 500000.0,
        "mapping": {"world_size": tp * pp_size, "tp_size": tp, "pp_size": pp_size, "cp_size": 1},
        "quantization": {"quant_algo": profile.quant_algo, "kv_cache_quant_algo": profile.kv_cache_quant_algo},
        "kvsim": {"profile": profile.name, "model": m.name},
    }


def read_config_json(path: Path, what: str) -> dict:
    """The JSON object in ``path``; ValueError (one line, naming the file and what must hold) for a file that
    cannot be read, is empty, is not JSON, or holds something other than an object."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what} {path} cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    if not text.strip():
        raise ValueError(f"{what} {path} is empty; it must hold a JSON object")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} {path} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{what} {path} must hold a JSON object, got {type(doc).__name__}")
    return doc


def config_int(doc: dict, key: str, where: str, default: object = None) -> int:
    """``doc[key]`` as a positive int; ValueError names the field. With a ``default``, an absent, null or zero
    value means the default (as TensorRT-LLM reads ``num_key_value_heads: 0``)."""
    value = doc.get(key)
    if value is None or (default is not None and not value):
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{where}: {key} must be a positive integer, got {value!r:.60}")
    try:
        number = int(value)
    except (ValueError, OverflowError):  # "abc", or JSON's Infinity / NaN
        raise ValueError(f"{where}: {key} must be a positive integer, got {value!r:.60}") from None
    if number < 1 or number >= 2 ** 63 or (isinstance(value, float) and value != number):
        raise ValueError(f"{where}: {key} must be a positive integer, got {value!r:.60}")
    return number


def model_spec_from_config(cfg: dict, where: str) -> ModelSpec:
    """A ModelSpec from a checkpoint config.json; fields that must exist are named when missing."""
    if not isinstance(cfg, dict):
        raise ValueError(f"{where}: the checkpoint config must be a JSON object, got {type(cfg).__name__}")
    required = ("architecture", "num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size")
    missing = [k for k in required if k not in cfg]
    if missing:
        raise ValueError(f"{where}: checkpoint config.json lacks {', '.join(missing)}")
    heads = config_int(cfg, "num_attention_heads", where)
    hidden = config_int(cfg, "hidden_size", where)
    spec = dict(architecture=cfg["architecture"], num_layers=config_int(cfg, "num_hidden_layers", where),
                hidden_size=hidden, num_heads=heads,
                num_kv_heads=config_int(cfg, "num_key_value_heads", where, heads),
                head_dim=config_int(cfg, "head_size", where, hidden // heads or None),
                intermediate_size=config_int(cfg, "intermediate_size", where, 4 * hidden),
                vocab_size=config_int(cfg, "vocab_size", where),
                max_position_embeddings=config_int(cfg, "max_position_embeddings", where, 2048))
    for known in MODELS.values():
        if all(getattr(known, k) == v for k, v in spec.items()):
            return known
    return ModelSpec(name=f"custom-{spec['num_layers']}l-{hidden}h", **spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvsim checkpoint",
                                     description="Write a TensorRT-LLM checkpoint config (no weights) for a profile.")
    parser.add_argument("--profile", required=True, help="<model>-<dtype>-<gpu>[-tpN]")
    parser.add_argument("--output_dir", required=True, type=Path)
    parser.add_argument("--tp_size", type=int, default=None, help="default: the profile's TP")
    parser.add_argument("--pp_size", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        profile = get_profile(args.profile)
    except KeyError as exc:
        print(f"kvsim checkpoint: {exc.args[0]}", file=sys.stderr)
        return 1
    if (args.tp_size is not None and args.tp_size < 1) or args.pp_size < 1:
        print("kvsim checkpoint: --tp_size and --pp_size must be >= 1", file=sys.stderr)
        return 1
    cfg = checkpoint_config(profile, args.tp_size, args.pp_size)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "config.json").write_text(json.dumps(cfg, indent=4) + "\n")
    print(f"wrote {args.output_dir / 'config.json'} ({profile.model.name}, tp {cfg['mapping']['tp_size']}, "
          f"pp {cfg['mapping']['pp_size']}, quant {cfg['quantization']['quant_algo']})")
    return 0
