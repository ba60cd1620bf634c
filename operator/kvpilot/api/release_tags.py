"""The TensorRT-LLM versions without the TensorRT backend, as RE2 patterns the CRD's admission rules can use.

TensorRT-LLM removed the TensorRT backend after 1.3.0rc20 (kvpilot/trtllm/options/releases.yaml: every row with
``tensorrt_backend: removed``, and every version above the table). The patterns match 1.3.0rc21 and later: 1.3.0rcN
with N >= 21, 1.3.0 and every later 1.3 release, 1.4 and later, 2.x and later; with an optional ``v``, ``.postN``
and a ``-suffix``. They live in the API package (which imports nothing from kvpilot) so the schema can use them;
``tests/unit/test_release_tags.py`` holds them equal to the release table (``trtllm/surface.release_of_image``)
over every canonical version form. No backslashes: they sit inside CEL string literals.
"""

from __future__ import annotations

_RC21 = "1[.]3[.]0[.]?rc(2[1-9]|[3-9][0-9]|[1-9][0-9][0-9]+)"  # 1.3.0rc21 and later rcs
_13_LATER = "1[.]3[.][1-9][0-9]*([.]?rc[0-9]+)?"  # 1.3.1, 1.3.1rc0
_13_FINAL = f"1[.]3([.]0)?|{_13_LATER}"  # 1.3, 1.3.0, 1.3.1, 1.3.1rc0 as tags: after rc20
_LATER = "1[.]([4-9]|[1-9][0-9]+)([.][0-9]+)?([.]?rc[0-9]+)?|([2-9]|[1-9][0-9]+)[.][0-9]+([.][0-9]+)?([.]?rc[0-9]+)?"
_PT_VERSION = f"({_RC21}|{_13_FINAL}|{_LATER})"
# A whole image reference whose tag (after the last ':' of the last path segment, before any '@digest') is one.
PYTORCH_ONLY_TAG_REGEX = f"^[^@]*:v?{_PT_VERSION}([.]post[0-9]+)?([-+][^/:@]*)?(@.*)?$"
# A bare version, as the image itself reports it (the build Job's probe reads tensorrt_llm.__version__).
PYTORCH_ONLY_VERSION_REGEX = f"^v?{_PT_VERSION}([.]post[0-9]+)?([-+].*)?$"
# KVSIM_TRTLLM_RELEASE: the release kvsim plays, by kvsim's names. Its row names are rows: ``1.3`` is kvsim's
# rc5-rc20 row (TensorRT still there); a version is read as the tag reads it (1.3.0, 1.3.1: after rc20, PyTorch
# only); nothing with a v, .postN or -suffix is playable (simulator/kvsim/trtllm/releases.py).
PYTORCH_ONLY_KVSIM_REGEX = f"^({_RC21}|1[.]3[.]0|{_13_LATER}|{_LATER})$"
