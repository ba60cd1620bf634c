"""No spec value reaches a shell unquoted (issue 13, finding 1).

The build script is rendered from specs that *bypass* admission (defaulted, never validated), so quoting
alone must keep every hostile value inert; it is then run for real with stub binaries. A separate test
checks admission refuses the same values, so they are stopped twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvpilot.api import patterns as P
from kvpilot.api.crd import spec_openapi
from kvpilot.api.models import InferenceEngineSpec, parse_spec
from kvpilot.api.validate import apply_defaults, validate_manifest
from tests.cases.engines import base, override
from tests.unit import script_sandbox as SB

FP = "0123456789abcdef0123456789abcdef"


def unvalidated_spec(backend: str = "tensorrt", **overrides: Any) -> InferenceEngineSpec:
    doc = override(base("hostile", backend), **overrides)
    return parse_spec(apply_defaults(spec_openapi()["properties"]["spec"], doc["spec"]))


def run_spec(tmp_path: Path, spec: InferenceEngineSpec, pvc_path: str | None = None) -> tuple[SB.Sandbox, Any]:
    sb = SB.make_sandbox(tmp_path)
    if pvc_path is not None:  # a checkpoint directory with a tokenizer at the (hostile) path
        d = sb.model / pvc_path
        d.mkdir(parents=True, exist_ok=True)
        (d / "tokenizer.json").write_text("{}")
    script = SB.render(sb, spec, FP)
    assert SB.syntax_ok(script).returncode == 0, script
    return sb, SB.run(sb, script)


def marker_payloads(marker: Path) -> list[str]:
    m = str(marker)
    return [f"$(touch {m})", f"`touch {m}`", f"x;touch {m};", f"x' ; touch {m}; '", f'x" ; touch {m}; "',
            f"x&&touch {m}", f"x|touch {m}", f"x\ntouch {m}", f"$(touch${{IFS}}{m})"]


@pytest.mark.parametrize("i", range(9))
def test_hostile_pvc_path_runs_nothing_and_reaches_the_converter_intact(tmp_path: Path, i: int) -> None:
    marker = tmp_path / "MARKER"
    payload = marker_payloads(marker)[i]
    path = f"llama/{payload}"
    spec = unvalidated_spec(model__source=f"pvc://models/{path}")
    sb, result = run_spec(tmp_path / "sb", spec, pvc_path=path)
    assert not marker.exists(), f"injection through {payload!r}"
    assert result.returncode == 0, result.stderr
    assert SB.recorded_argvs(sb) == SB.expected_argvs(sb, spec, FP)


def test_a_quote_in_the_path_does_not_break_the_script_after_trtllm_build(tmp_path: Path) -> None:
    path = "llama/it's here"
    spec = unvalidated_spec(model__source=f"pvc://models/{path}")
    sb, result = run_spec(tmp_path, spec, pvc_path=path)
    assert result.returncode == 0, result.stderr
    assert (sb.cache / FP / "kvpilot-engine.json").is_file()


def test_a_space_in_the_path_publishes_the_tokenizer(tmp_path: Path) -> None:
    path = "llama/with space"
    spec = unvalidated_spec(model__source=f"pvc://models/{path}")
    sb, result = run_spec(tmp_path, spec, pvc_path=path)
    assert result.returncode == 0, result.stderr
    assert (sb.cache / FP / "tokenizer" / "tokenizer.json").is_file()


def test_a_dataset_that_looks_like_a_stage_path_is_not_expanded(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    dataset = f"$STAGE$(touch {marker})"
    spec = unvalidated_spec(build__quantization="fp8", build__calibration={"dataset": dataset})
    sb, result = run_spec(tmp_path / "sb", spec)
    assert not marker.exists()
    assert result.returncode == 0, result.stderr
    calls = SB.recorded_argvs(sb)
    assert dataset in calls[1], calls[1]


def test_hostile_hf_ids_and_revisions_reach_the_download_intact(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    spec = unvalidated_spec(model__source=f"hf://org/$(touch {marker})", model__revision=f"main;touch {marker}")
    sb, result = run_spec(tmp_path / "sb", spec)
    assert not marker.exists()
    assert result.returncode == 0, result.stderr
    assert SB.recorded_argvs(sb) == SB.expected_argvs(sb, spec, FP)


@pytest.mark.parametrize("source", [
    "pvc://models/llama/$(touch /tmp/x)", "pvc://models/a;b", "pvc://models/it's", "pvc://models/with space",
    "pvc://models/../../etc", "pvc://models/a\nb", "hf://org/name;x", "s3://bucket/a b",
])
def test_admission_refuses_shell_metacharacters_in_sources(source: str) -> None:
    doc = override(base("hostile", "tensorrt"), model__source=source)
    _out, errors = validate_manifest(doc, spec_openapi())
    assert any(e.path == "spec.model.source" for e in errors), [str(e) for e in errors]


# Every string a test run may put in a field: printable ASCII, shell metacharacters, unicode, controls.
TEMPLATES = ("$(touch MARKER)", "`touch MARKER`", "a;touch MARKER", "a' ; touch MARKER ;'", 'a" ; touch MARKER ;"',
             "$STAGE$(touch MARKER)", "a b\tc", "-x --y", "a\ntouch MARKER", "\\$(touch MARKER)")
hostile_text = st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1,
            max_size=40),
    st.sampled_from(TEMPLATES),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(path=hostile_text, revision=hostile_text, dataset=hostile_text, image=hostile_text)
def test_any_text_in_any_string_field_is_inert(tmp_path_factory: pytest.TempPathFactory, path: str,
                                               revision: str, dataset: str, image: str) -> None:
    """Quoting alone (admission bypassed) delivers arbitrary text intact and runs nothing else."""
    root = tmp_path_factory.mktemp("prop")
    marker = root / "MARKER"
    text = [t.replace("MARKER", str(marker)) for t in (path, revision, dataset, image)]
    for quantization, source in (("fp8", f"pvc://models/{text[0]}"), ("none", f"hf://org/{text[0]}")):
        spec = unvalidated_spec(model__source=source, model__revision=text[1], build__quantization=quantization,
                                build__calibration={"dataset": text[2]}, runtime__image=text[3])
        sb = SB.make_sandbox(root / quantization)
        script = SB.render(sb, spec, FP, image=text[3])
        assert SB.syntax_ok(script).returncode == 0, script
        result = SB.run(sb, script)
        assert result.returncode == 0, result.stderr
        assert not marker.exists()
        assert SB.recorded_argvs(sb) == SB.expected_argvs(sb, spec, FP)


# Characters admission allows in paths and ids, mixed with the shell's: most draws are refused, the rest
# must build inertly.
MIXED = st.text(alphabet="abzAZ09-_./=+:@ $;'\"`\n(){}|&\\*?~!#", min_size=1, max_size=24)


def _field(regex: str, max_size: int = 60) -> st.SearchStrategy[str]:
    """Half the draws match the field's own regex (they get through admission), half are mixed."""
    return st.one_of(st.from_regex(regex, fullmatch=True).filter(lambda v: len(v) <= max_size), MIXED)


ACCEPTED: list[int] = []


# derandomize: the same draws on every run (18% of them accepted by admission). Random draws let the check below
# fail by chance (a CI run on 2026-12-06 drew 9 accepted, under its 10), and a failure in CI reproduces on a laptop.
@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much])
@given(source=_field(P.SOURCE_REGEX, 1024), revision=_field(P.REVISION_REGEX), dataset=_field(P.DATASET_REGEX),
       image=_field(P.IMAGE_REGEX), claim=_field("^[a-z0-9]{1,20}$"), gpu=_field(P.LABEL_VALUE_REGEX),
       env=st.text(max_size=30))
def test_every_string_that_passes_validation_builds_inertly(tmp_path_factory: pytest.TempPathFactory, source: str,
                                                            revision: str, dataset: str, image: str, claim: str,
                                                            gpu: str, env: str) -> None:
    doc = override(base("prop", "tensorrt"), model__source=source, model__revision=revision,
                   build__quantization="fp8", build__calibration={"dataset": dataset}, runtime__image=image,
                   runtime__env=[{"name": "X", "value": env}], serving__gpuProduct=gpu,
                   engineCache={"claimName": claim})
    defaulted, errors = validate_manifest(doc, spec_openapi())
    event("accepted" if not errors else "refused")
    if errors:
        return  # refused at admission, with a message (test_validation checks the messages)
    ACCEPTED.append(1)
    spec = parse_spec(defaulted["spec"])
    root = tmp_path_factory.mktemp("valid")
    pvc_path = spec.model.location.partition("/")[2] if spec.model.scheme == "pvc" else None
    sb, result = run_spec(root / "sb", spec, pvc_path=pvc_path)
    assert result.returncode == 0, result.stderr
    assert SB.recorded_argvs(sb) == SB.expected_argvs(sb, spec, FP)
    if pvc_path is not None:
        assert (sb.cache / FP / "tokenizer" / "tokenizer.json").is_file()


def test_the_property_above_reached_the_build() -> None:
    """Runs after it (file order): a property whose every draw was refused would prove nothing."""
    assert len(ACCEPTED) >= 10, len(ACCEPTED)
