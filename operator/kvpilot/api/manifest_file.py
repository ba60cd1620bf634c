"""Reads a manifest file as untrusted input: bounded, strict YAML, every failure an error naming the document.

``kvpilot render`` is run on files from anywhere (a pull request, a chat paste), so reading one must never
raise a traceback nor run away (issue 13: a 5000-deep nesting raised RecursionError, a binary file
UnicodeDecodeError, and a YAML alias bomb ran past 120 s at 800 MB). The limits follow what the API server
would accept anyway: it refuses request bodies over 3 MiB, and an InferenceEngine nests about six levels.
YAML aliases are refused outright: a manifest has no use for them, and expanding them is what makes the bomb.
Duplicate keys are errors, not silently last-wins as PyYAML (and YAML 1.1) would have it.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import yaml
from yaml.nodes import MappingNode, Node

MAX_BYTES = 3 * 1024 * 1024
MAX_DEPTH = 64
MAX_DOCUMENTS = 1000
MESSAGE_MAX = 400


class ManifestFileError(ValueError):
    """A file that is not a readable YAML stream of manifests; the message names the document and line."""


def _cut(text: str) -> str:
    return text if len(text) <= MESSAGE_MAX else text[:MESSAGE_MAX] + f"... ({len(text)} characters)"


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases, duplicate keys and nesting deeper than MAX_DEPTH."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self._next_event()
            anchor = event.anchor if isinstance(event, yaml.events.NodeEvent) else ""
            raise yaml.composer.ComposerError(
                None, None, f"YAML aliases (*{anchor}) are not accepted in manifests: write the value out",
                self._next_mark())
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nesting deeper than {MAX_DEPTH} levels is not accepted", self._next_mark())
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def _next_event(self) -> yaml.events.Event:
        """The event the parser reads next (types-PyYAML leaves ``Parser.peek_event`` unannotated)."""
        peek: Callable[[], yaml.events.Event] = self.peek_event
        return peek()

    def _next_mark(self) -> yaml.error.Mark | None:
        """Where the next event starts (the pure-Python parser SafeLoader uses marks with ``yaml.error.Mark``)."""
        mark = self._next_event().start_mark
        return mark if isinstance(mark, yaml.error.Mark) else None

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<` merges; explicit keys override what it brings
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key (a list or mapping): let the base class word the error
                continue
            if first is not key_node.start_mark:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"duplicate key {_cut(repr(key))} (first at line {first.line + 1})", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def decode(data: bytes, source: str) -> str:
    """The file's text: at most MAX_BYTES of UTF-8 (a byte-order mark is allowed)."""
    if len(data) > MAX_BYTES:
        raise ManifestFileError(f"{source}: larger than {MAX_BYTES // (1024 * 1024)} MiB (the API server's limit)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ManifestFileError(
            f"{source}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}): is it a binary file?"
        ) from None


def documents(text: str, source: str) -> Iterator[tuple[int, Any]]:
    """Each non-empty document with its 1-based number; an empty stream is an error."""
    try:
        loader = StrictLoader(text)
    except yaml.YAMLError as exc:  # the reader refuses control characters before any document is parsed
        raise ManifestFileError(f"{source}: document 1: {_cut(str(exc))}") from None
    number = 0
    found = 0
    try:
        while True:
            number += 1
            try:
                if not loader.check_node():
                    break
                doc = loader.get_data()
            except yaml.YAMLError as exc:
                raise ManifestFileError(f"{source}: document {number}: {_cut(str(exc))}") from None
            except RecursionError:  # a parser corner the depth bound did not reach
                raise ManifestFileError(f"{source}: document {number}: nested too deeply") from None
            if number > MAX_DOCUMENTS:
                raise ManifestFileError(f"{source}: more than {MAX_DOCUMENTS} documents")
            if doc is None:
                continue
            found += 1
            yield number, doc
    finally:
        loader.dispose()
    if not found:
        raise ManifestFileError(f"{source}: no manifest in the file (it is empty or holds only comments)")
