"""Reading user YAML (recipes, gate configs, task files) strictly: safe tags only, no duplicate keys, no aliases.

PyYAML's SafeLoader already refuses `!!python/...` tags (no code runs). It still expands aliases, so a few hundred
bytes of nested `*refs` ("billion laughs") become gigabytes of objects and a multi-megabyte error message; none
of quantkit's files needs an alias, so they are refused where they appear.
"""

from __future__ import annotations

from typing import Any

import yaml

from quantkit.io.jsonin import MAX_INT_DIGITS


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects aliases and duplicate keys (which PyYAML would resolve silently to the last one), and
    turns a scalar its constructors cannot build into a ConstructorError at that scalar's line."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "YAML aliases (*name) are not supported; write the value out", event.start_mark
            )
        return super().compose_node(parent, index)

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        # SafeConstructor's scalar constructors raise bare ValueErrors: `2024-13-45` (a timestamp: "month must be in
        # 1..12"), `!!float abc`, and a 5,000-digit integer (Python's int-digit limit, "Exceeds the limit (4300
        # digits)"). Long integers are refused in every base: hexadecimal has no limit in int(), but printing the
        # value in decimal later would hit it.
        if (
            isinstance(node, yaml.ScalarNode)
            and node.tag == "tag:yaml.org,2002:int"
            and len(node.value) > MAX_INT_DIGITS
        ):
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {len(node.value)} digits (at most {MAX_INT_DIGITS})", node.start_mark
            )
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as e:
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read this value ({' '.join(str(e).split())[:80]})", node.start_mark
            ) from None


def _construct_unique_mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {str(key)[:80]!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


class TooDeepError(yaml.YAMLError):
    """A document nested deeper than Python's recursion limit (hostile or corrupt)."""

    problem = "nested too deeply to read (a hostile or corrupt file?)"
    problem_mark = None

    def __str__(self) -> str:
        return self.problem


def load_yaml(text: str) -> Any:
    """Parse one YAML document strictly; raises yaml.YAMLError (callers name the file in their one-line error)."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # a SafeLoader subclass: safe tags only
    except RecursionError:
        raise TooDeepError() from None
