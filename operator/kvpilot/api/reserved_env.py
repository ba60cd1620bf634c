"""The environment variables kvpilot sets itself in the pods it renders: ``runtime.env`` may not set them.

Why: a name given twice in a container's env makes the API server refuse the whole Deployment or Job
("duplicate entries for key"), on every retry, long after admission accepted the engine (issue 22). So the
renderers (``desired/pod_parts.py``, ``trtllm/release.py``) take the names from here, the CRD lists and refuses
them (``schema_build.runtime_schema``, with ``validate.py`` evaluating the same rules offline), and
``tests/unit/test_reserved_env.py`` renders every backend and model source and fails on an env name that is
rendered but not listed here.
"""

from __future__ import annotations

# The simulated backend's settings (runtime.simulation), read by kvsim's trtllm-build and trtllm-serve.
KVSIM_PROFILE = "KVSIM_PROFILE"
KVSIM_SPEEDUP = "KVSIM_SPEEDUP"
KVSIM_STARTUP_SECONDS = "KVSIM_STARTUP_SECONDS"
KVSIM_BUILD_SECONDS = "KVSIM_BUILD_SECONDS"
# model.credentialsSecretRef, by key: the Hugging Face token, and the AWS CLI's keys for s3:// sources.
HF_TOKEN = "HF_TOKEN"
AWS_ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"
AWS_SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"
AWS_SESSION_TOKEN = "AWS_SESSION_TOKEN"
AWS_REGION = "AWS_REGION"
# Where the PyTorch kernel autotuner's cache is (trtllm/release.py AUTOTUNER_CACHE_ENV: the serving pods of an
# engine whose checkpoint is prepared, and the prepare script's export).
TLLM_AUTOTUNER_CACHE_PATH = "TLLM_AUTOTUNER_CACHE_PATH"
# Not set by kvpilot but relied on: the build script names its staging directory after the pod
# ($HOSTNAME, set by the container runtime), so two pods of one Job never share one.
HOSTNAME = "HOSTNAME"

RESERVED_ENV: tuple[str, ...] = (
    KVSIM_PROFILE, KVSIM_SPEEDUP, KVSIM_STARTUP_SECONDS, KVSIM_BUILD_SECONDS,
    HF_TOKEN, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION,
    TLLM_AUTOTUNER_CACHE_PATH, HOSTNAME,
)


def reserved_list() -> str:
    """The reserved names as the CRD description and the refusal message list them."""
    return ", ".join(RESERVED_ENV)
