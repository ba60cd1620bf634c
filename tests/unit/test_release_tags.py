"""The admission patterns for releases without the TensorRT backend (api/release_tags.py) say exactly what the
release table says (trtllm/surface.py), over every canonical version form; and the operator reads
KVSIM_TRTLLM_RELEASE as kvsim plays it."""

from __future__ import annotations

import itertools

import pytest
import re2

from kvpilot.api.release_tags import PYTORCH_ONLY_KVSIM_REGEX, PYTORCH_ONLY_TAG_REGEX, PYTORCH_ONLY_VERSION_REGEX
from kvpilot.trtllm import surface as S
from kvpilot.trtllm.backend import kvsim_row

IMAGE = "nvcr.io/nvidia/tensorrt-llm/release"


def versions() -> list[str]:
    """Canonical TensorRT-LLM version strings around every boundary the table has."""
    out = []
    for major, minor in itertools.product((0, 1, 2, 10), (0, 1, 2, 3, 4, 5, 9, 10, 12)):
        for patch, rc in itertools.product((None, 0, 1, 2), (None, 0, 4, 5, 19, 20, 21, 22, 29, 99, 100)):
            if patch is None and rc is not None:
                continue
            text = f"{major}.{minor}" + ("" if patch is None else f".{patch}") + ("" if rc is None else f"rc{rc}")
            out += [text, f"v{text}", f"{text}.post1", f"{text}-custom"]
    return out


def removed(version: str) -> bool:
    return S.get(S.release_of_version(version)).tensorrt_removed


def test_the_image_pattern_is_the_table() -> None:
    wrong = [v for v in versions() if bool(re2.search(PYTORCH_ONLY_TAG_REGEX, f"{IMAGE}:{v}")) != removed(v)]
    assert wrong == []
    assert len(versions()) > 1000  # the table's every boundary, each in four spellings


def test_the_version_pattern_the_build_job_probe_uses_is_the_table() -> None:
    assert [v for v in versions() if bool(re2.search(PYTORCH_ONLY_VERSION_REGEX, v)) != removed(v)] == []


@pytest.mark.parametrize("image", [
    "registry.local:5000/trtllm", f"{IMAGE}@sha256:{'a' * 64}", f"{IMAGE}:latest", "registry:2.0/trtllm",
    f"{IMAGE}:1.3.0rc20", f"{IMAGE}:1.2.1-custom",
])
def test_what_names_no_pytorch_only_release_is_not_refused_at_admission(image: str) -> None:
    assert not re2.search(PYTORCH_ONLY_TAG_REGEX, image)
    assert not S.get(S.release_of_image(image)).tensorrt_removed


@pytest.mark.parametrize("image", [f"{IMAGE}:1.4.0rc1", f"{IMAGE}:1.3.0rc22.post1@sha256:{'b' * 64}",
                                   "registry.local:5000/trt/llm:v1.3.0rc21", f"{IMAGE}:1.5.0"])
def test_pytorch_only_images_match_wherever_the_tag_sits(image: str) -> None:
    assert re2.search(PYTORCH_ONLY_TAG_REGEX, image)
    assert S.get(S.release_of_image(image)).tensorrt_removed


def _kvsim_cases() -> list:
    """Every name kvsim's resolve accepts; the PyTorch-only ones are strict expected failures until kvsim plays
    them (kvsim's release table grows on the kvsim branch)."""
    from kvsim.trtllm.releases import RELEASES

    names = ["1.2.0", "1.2.0rc2", "1.2.1", "1.3", "1.3.0", "1.3.1", "1.3.1rc0", "1.3.0rc7", "1.3.0rc20", "1.3.0rc21",
             "1.3.0rc22", "1.3.0rc29", "1.4", "1.4.0rc1"]
    out = []
    for name in names:
        pending = kvsim_row(name) in ("1.3.0rc21", "1.4") and kvsim_row(name) not in RELEASES
        out.append(pytest.param(name, marks=pytest.mark.xfail(strict=True, reason="kvsim does not play it yet"))
                   if pending else name)
    return out


@pytest.mark.parametrize("name", _kvsim_cases())
def test_the_operator_reads_kvsim_trtllm_release_as_kvsim_plays_it(name: str) -> None:
    from kvsim.trtllm.releases import resolve

    played = resolve(name)
    assert kvsim_row(name) == played.name
    assert bool(re2.search(PYTORCH_ONLY_KVSIM_REGEX, name)) is S.get(played.name).tensorrt_removed
