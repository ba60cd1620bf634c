"""The hostile-manifest corpus through the validator, `kvpilot render` and the build script (issue 13).

Every file must end in exit 0 or an `error:` line (exit 2), never a traceback. Every engine that is accepted
has its build script checked by `bash -n` and run with stub binaries: no payload may run (`kvpilot-pwned`
must not appear) and every value must reach its process intact.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from kvpilot.cli import load_engines, main
from kvpilot.desired.fingerprint import compute_fingerprint
from kvpilot.desired.settings import Settings
from kvpilot.desired.pod_parts import image_for
from tests.fuzz.generate import MARKER, OUT, corpus
from tests.unit import script_sandbox as SB

FILES = sorted(OUT.glob("*.yaml"))
OUTCOMES: Counter[str] = Counter()


def test_the_corpus_is_committed_and_up_to_date() -> None:
    generated = corpus()
    assert len(generated) >= 200
    assert sorted(generated) == [f.name for f in FILES], "run: python -m tests.fuzz.generate"
    stale = [f.name for f in FILES if f.read_bytes() != generated[f.name]]
    assert not stale, stale


@pytest.mark.parametrize("path", FILES, ids=[f.name for f in FILES])
def test_hostile_manifest_gives_an_error_or_an_inert_build(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           path: Path) -> None:
    rc = main(["render", "-f", str(path)])
    err = capsys.readouterr().err
    assert rc in (0, 2)
    assert "Traceback" not in err
    if rc == 2:
        assert err.startswith("error: ") and len(err) < 20_000, err[:2000]
        OUTCOMES["rejected"] += 1
        return
    OUTCOMES["accepted"] += 1
    settings = Settings()
    for engine in load_engines(str(path)):
        if not engine.spec.builds_engine:
            continue
        image = image_for(engine.spec, settings.kvsim_image, settings.default_image)
        fp = compute_fingerprint(engine.spec, image, engine.spec.build.max_batch_size)
        sb = SB.make_sandbox(tmp_path / "sb")
        script = SB.render(sb, engine.spec, fp, image=image)
        assert SB.syntax_ok(script).returncode == 0, script
        result = SB.run(sb, script)
        assert not (sb.root / MARKER).exists(), f"{path.name}: a payload ran"
        assert result.returncode == 0, result.stderr
        assert SB.recorded_argvs(sb) == SB.expected_argvs(sb, engine.spec, fp)
        OUTCOMES["built"] += 1


def test_print_outcomes() -> None:
    """Figures for the report (runs last in file order): how many files were refused, accepted, built."""
    print(f"\nfuzz corpus: {len(FILES)} files, {dict(OUTCOMES)}")
