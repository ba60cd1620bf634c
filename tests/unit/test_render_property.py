"""Any valid InferenceEngine renders, and every command it renders passes the real parsers' option lists."""

from __future__ import annotations

from datetime import datetime, timezone

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvpilot.api.crd import spec_openapi
from kvpilot.api.status import status_dict
from kvpilot.api.models import InferenceEngine, ObjectRef, parse_spec
from kvpilot.api.enums import ARCHITECTURES, QUANTIZATIONS, TOKENS_PER_BLOCK_CHOICES
from kvpilot.api.validate import validate_manifest
from kvpilot.desired.observed import Observed
from kvpilot.desired.plan import plan
from kvpilot.desired.settings import Settings
from kvpilot.trtllm import options
from kvpilot.trtllm.build_script import build_commands
from kvpilot.trtllm.serve import ServedEngine, serve_command
from tests.cases.engines import base, override

specs = st.fixed_dictionaries({
    "runtime__backend": st.sampled_from(["tensorrt", "pytorch", "simulated"]),
    "model__architecture": st.sampled_from(ARCHITECTURES),
    "build__quantization": st.sampled_from(QUANTIZATIONS),
    "build__kvCacheDtype": st.sampled_from(["auto", "fp8", "int8"]),
    "build__tensorParallelSize": st.sampled_from([1, 2, 4, 8]),
    "build__maxBatchSize": st.integers(1, 4096),
    "build__kvCache": st.fixed_dictionaries({"tokensPerBlock": st.sampled_from(TOKENS_PER_BLOCK_CHOICES)}),
    "batching__maxBatchSize": st.integers(1, 4096),
    "batching__schedulerPolicy": st.sampled_from(["GuaranteedNoEvict", "MaxUtilization"]),
    "serving__replicas": st.integers(0, 8),
    "autotune__mode": st.sampled_from(["Auto", "Advisory"]),
})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(overrides=specs)
def test_valid_engines_render_with_real_flags_only(overrides: dict) -> None:
    doc = override(base("prop", overrides["runtime__backend"]), **overrides)
    defaulted, errors = validate_manifest(doc, spec_openapi())
    assume(not errors)  # invalid combinations are admission's business (tested elsewhere)
    spec = parse_spec(defaulted["spec"])
    e = InferenceEngine(ObjectRef("prop", "ns", "u", 1), spec)
    p = plan(e, Observed(claim_phase="Bound"), Settings(), datetime(2026, 11, 29, tzinfo=timezone.utc))
    in_force = status_dict(p.status)["batching"]["maxBatchSize"]
    if spec.builds_engine:
        assert in_force <= spec.build.max_batch_size  # never above the engine's ceiling
    else:
        assert in_force <= max(spec.batching.max_batch_size, spec.autotune.max_batch_size)
    cmds = build_commands(spec, p.fingerprint, spec.build.max_batch_size) if spec.builds_engine else []
    served = ServedEngine(p.fingerprint, spec.build.max_batch_size, spec.build.max_num_tokens,
                          spec.build.tensor_parallel_size, spec.build.pipeline_parallel_size)
    cmds.append(serve_command(spec, served if spec.builds_engine else None, spec.batching.max_batch_size))
    for cmd in cmds:
        assert options.check(cmd) == [], cmd.argv
    serve = cmds[-1].argv
    if spec.builds_engine:
        assert int(serve[serve.index("--max_batch_size") + 1]) <= spec.build.max_batch_size
