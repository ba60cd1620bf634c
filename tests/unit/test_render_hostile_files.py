"""`kvpilot render` on bad files (issue 13, finding 5): an error naming the document and what must hold, exit 2,
never a traceback, never a runaway."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvpilot.cli import main
from tests.cases.engines import base

VALID = yaml.safe_dump(base("ok"))
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(9)
)


def render(tmp_path: Path, content: str | bytes, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    f = tmp_path / "in.yaml"
    f.write_bytes(content if isinstance(content, bytes) else content.encode())
    rc = main(["render", "-f", str(f)])
    return rc, capsys.readouterr().err


CASES = [
    ("metadata-list", VALID.replace("metadata:\n  name: ok", "metadata:\n- name\n- ok"), "metadata"),
    ("deep-flow-nesting", "spec: " + "[" * 5000 + "]" * 5000 + "\n", "nesting deeper than 64"),
    ("deep-block-nesting", "".join("  " * i + f"k{i}:\n" for i in range(200)) + "  " * 200 + "v\n",
     "nesting deeper than 64"),
    ("binary", bytes(range(256)) * 4, "not UTF-8"),
    ("alias-bomb", ALIAS_BOMB, "aliases"),
    ("alias-in-spec", VALID + "x: &v 1\ny: *v\n", "aliases"),
    ("empty", "", "no manifest"),
    ("comments-only", "# nothing\n---\n", "no manifest"),
    ("duplicate-key", VALID + "kind: InferenceEngine\n", "duplicate key 'kind'"),
    ("nested-duplicate", VALID.replace("spec:\n", "spec:\n  runtime: {}\n", 1), "duplicate key 'runtime'"),
    ("second-document-invalid", VALID + "---\n" + VALID.replace("name: ok", "name: Bad_Name"),
     "document 2: InferenceEngine \"Bad_Name\""),
    ("second-document-unparsable", VALID + "---\nspec: [\n", "document 2"),
    ("scalar-document", "just a string\n", "must be a YAML mapping"),
    ("name-not-string", VALID.replace("name: ok", "name: [1, 2]"), "metadata.name"),
    ("namespace-bad", VALID.replace("name: ok", "name: ok\n  namespace: Not/Valid"), "metadata.namespace"),
    ("nul-byte", VALID + "x: \"\0\"\n", "document 1"),
    ("too-big", "a: " + "x" * (4 * 1024 * 1024) + "\n", "larger than 3 MiB"),
    ("unhashable-key", "? [a, b]\n: 1\n", "document 1"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_file_is_an_error_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              case: tuple) -> None:
    _id, content, words = case
    rc, err = render(tmp_path, content, capsys)
    assert rc == 2, err
    assert err.startswith("error: "), err
    assert words in err, err
    assert "Traceback" not in err


def test_a_huge_value_is_cut_in_the_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = base("big")
    doc["spec"]["model"]["revision"] = "r" * 2_000_000
    rc, err = render(tmp_path, yaml.safe_dump(doc), capsys)
    assert rc == 2
    assert "2000000 characters" in err and len(err) < 3000, err[:4000]


def test_a_valid_file_still_renders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "ok.yaml"
    f.write_text(VALID)
    assert main(["render", "-f", str(f)]) == 0
    assert "kind: Job" in capsys.readouterr().out


def test_a_missing_file_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "-f", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err
