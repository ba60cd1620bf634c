"""The real TensorRT-LLM parsers' option lists (``options/*.yaml``, each citing its source commit), and a
checker that every rendered command uses only those options with acceptable values.

This is how kvpilot guarantees it never renders a flag TensorRT-LLM does not have — such as the ones the blog
that inspired the project uses (listed under ``not_options`` in ``options/trtllm_build.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from kvpilot.trtllm.build import Command

# Tools whose argv starts with "python3 <script>"; the rest start with the program name.
_SCRIPT_TOOLS = {"quantize", "convert_checkpoint_llama", "convert_checkpoint_qwen", "convert_checkpoint_gemma"}
_POSITIONALS = {"trtllm-serve": 1}
# Tools kvpilot runs that are not TensorRT-LLM parsers (kvsim's stand-ins, the download and ModelOpt one-liners,
# the hard-link copy).
_UNCHECKED = {"python", "kvsim_checkpoint", "kvsim_prepare", "cp"}
# The prepare Job's warm-up driver: python3 -c DRIVER PORT DEADLINE, then a whole trtllm-serve command line.
_WARMUP_PREFIX = 5


@dataclass(frozen=True)
class OptionSpec:
    tool: str
    source: str
    options: dict[str, dict[str, Any]]
    aliases: dict[str, str]
    not_options: tuple[str, ...] = ()  # names people use that this parser does not have

    def lookup(self, flag: str) -> dict[str, Any] | None:
        flag = self.aliases.get(flag, flag)
        return self.options.get(flag)


@lru_cache(maxsize=None)
def load(tool: str) -> OptionSpec:
    name = tool.replace("-", "_") + ".yaml"
    text = resources.files("kvpilot.trtllm").joinpath("options", name).read_text()
    data = yaml.safe_load(text)
    return OptionSpec(
        tool=data["tool"],
        source=data["source"],
        options={k: (v or {}) for k, v in data["options"].items()},
        aliases=data.get("aliases") or {},
        # Listed without their leading dashes, so the data never spells a flag TensorRT-LLM does not have.
        not_options=tuple("--" + str(n).split()[0].lstrip("-") for n in data.get("not_options") or []),
    )


def check(command: Command) -> list[str]:
    """Problems with ``command`` against its parser's option list; empty when every flag is real."""
    if command.tool in _UNCHECKED:
        return []
    if command.tool == "warmup":
        return check(Command("trtllm-serve", command.argv[_WARMUP_PREFIX:]))
    spec = load(command.tool)
    args = list(command.argv[2:] if command.tool in _SCRIPT_TOOLS else command.argv[1:])
    problems: list[str] = []
    positionals = 0
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-"):
            positionals += 1
            if positionals > _POSITIONALS.get(command.tool, 0):
                problems.append(f"{command.tool}: unexpected positional argument {arg!r}")
            i += 1
            continue
        flag, _, inline = arg.partition("=")
        option = spec.lookup(flag)
        if option is None:
            problems.append(f"{command.tool}: {flag} is not an option of {spec.source}")
            i += 1
            continue
        if not option.get("takes_value", True):
            i += 1
            continue
        value = inline if inline else (args[i + 1] if i + 1 < len(args) else None)
        if value is None or (not inline and value.startswith("--")):
            problems.append(f"{command.tool}: {flag} needs a value")
        elif option.get("choices") and value not in [str(c) for c in option["choices"]]:
            problems.append(f"{command.tool}: {flag} {value!r} is not one of {option['choices']}")
        i += 1 if inline else 2
    return problems
