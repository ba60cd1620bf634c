"""The schema of ``spec.runtime.env``: each name once, and none that kvpilot sets itself (issue 22).

Both would pass a plain schema and then make the API server refuse every Deployment and Job apply ("duplicate
entries for key"), retried forever while the engine looks settled. The rules are CEL, so the API server and
``kvpilot render`` (``validate.py`` evaluates the same rules) refuse them alike, with a message that names the
variable.
"""

from __future__ import annotations

from kvpilot.api.openapi import Schema, array, obj, string
from kvpilot.api.reserved_env import RESERVED_ENV, reserved_list

ENV_MAX_ITEMS = 64
_RESERVED_CEL = "[" + ", ".join(f"'{name}'" for name in RESERVED_ENV) + "]"
# The first name given more than once (only evaluated when the rule failed, so there is one). Mapped to the names
# first: the API server's cost estimate then knows the result is a name (at most 128 characters); a field of a
# filtered element counts as a string of any size, and the concatenation blows the CRD's cost budget.
_REPEATED_CEL = "self.map(e, e.name).filter(n, !self.exists_one(f, f.name == n))[0]"


def reserved_name_rule() -> Schema:
    """On each variable's name: not one kvpilot renders."""
    return {
        "rule": f"!(self in {_RESERVED_CEL})",
        "message": f"must not be a name kvpilot sets itself ({reserved_list()})",
        "messageExpression": (
            f"'runtime.env name ' + self + ' is set by kvpilot itself; runtime.env may not set "
            f"{reserved_list()} (use runtime.simulation and model.credentialsSecretRef instead)'"
        ),
    }


def unique_names_rule() -> Schema:
    """On the list: no name twice (the API server refuses a container whose env repeats a name)."""
    return {
        "rule": "self.all(e, self.exists_one(f, f.name == e.name))",
        "message": "each runtime.env name may appear only once",
        "messageExpression": (
            f"'runtime.env sets ' + {_REPEATED_CEL} + ' more than once; each name may appear only once "
            "(the API server refuses a container whose env repeats a name)'"
        ),
    }


def env_schema() -> Schema:
    name = string("Variable name.", max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    name["x-kubernetes-validations"] = [reserved_name_rule()]
    schema = array(
        "Extra environment variables for the build and serving containers (e.g. NCCL_DEBUG, HF_HUB_OFFLINE). "
        f"Each name at most once. Names kvpilot sets itself are refused: {reserved_list()} (they come from "
        "runtime.simulation and model.credentialsSecretRef, or locate the engine cache's files; HOSTNAME names the "
        "build's staging directory). KVSIM_TRTLLM_RELEASE (simulated backend) names the TensorRT-LLM release kvsim "
        "plays.",
        obj(
            "An environment variable.",
            {"name": name, "value": string("Variable value.", max_length=4096)},
            required=("name",),
        ),
        max_items=ENV_MAX_ITEMS,
    )
    schema["x-kubernetes-validations"] = [unique_names_rule()]
    return schema
