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


def model_spec_from_config(cfg: dict, where: str) -> ModelSpec:
    """A ModelSpec from a checkpoint config.json; fields that must exist are named when missing."""
    required = ("architecture", "num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size")
    missing = [k for k in required if k not in cfg]
    if missing:
        raise ValueError(f"{where}: checkpoint config.json lacks {', '.join(missing)}")
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    spec = dict(architecture=cfg["architecture"], num_layers=int(cfg["num_hidden_layers"]), hidden_size=hidden,
                num_heads=heads, num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_size") or hidden // heads),
                intermediate_size=int(cfg.get("intermediate_size") or 4 * hidden),
                vocab_size=int(cfg["vocab_size"]),
                max_position_embeddings=int(cfg.get("max_position_embeddings") or 2048))
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
