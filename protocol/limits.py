"""Size limits of spec documents: nesting depth and node count, aliases counted as expanded.

A job spec is a few hundred nodes, six levels deep. A hostile document can be tiny and still
expand enormously (YAML "billion laughs": anchors of aliases of anchors) or nest so deep that a
recursive parser overflows the stack. ``load_yaml_bounded`` checks the parser's event stream for
depth before anything recursive runs, then sizes the composed node graph with each shared
(aliased) node counted once per use, without expanding it; only then are Python objects built.
``check_data_limits`` applies the same limits to already-parsed data (a JSON body).

Every refusal is a ``LimitError`` (a ``ValueError``) whose message names the limit.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_DEPTH = 32
"""Deepest nesting of mappings/sequences accepted (a JobSpec needs about 6)."""

MAX_NODES = 20_000
"""Most scalars + collections accepted, every alias counted as a full copy of its anchor."""


_EVENT_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser when PyYAML was built with it (the depth scan then costs microseconds)."""


class LimitError(ValueError):
    """A document over ``MAX_DEPTH`` or ``MAX_NODES`` (or with a cyclic alias)."""


def load_yaml_bounded(text: str, loader: type[yaml.SafeLoader] = yaml.SafeLoader) -> Any:
    """``yaml.load(text, loader)`` after checking depth and expanded node count.

    Raises:
        LimitError: nesting deeper than ``MAX_DEPTH``, more than ``MAX_NODES`` nodes once aliases
            are expanded, or an alias that refers to its own enclosing node.
        yaml.YAMLError: malformed YAML.
    """
    _check_event_depth(text)
    node = yaml.compose(text, Loader=loader)
    if node is None:
        return None
    _expanded_size(node, {}, set())
    instance = loader(text)
    try:
        return instance.construct_document(node)
    finally:
        instance.dispose()


def check_data_limits(data: Any) -> None:
    """Check parsed data (dicts, lists, scalars) against ``MAX_DEPTH`` and ``MAX_NODES``.

    Iterative, so it is safe on any depth. Raises ``LimitError``.
    """
    stack, nodes = [(data, 0)], 0
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise LimitError(f"more than {MAX_NODES} values (limit MAX_NODES)")
        if isinstance(item, dict | list):
            if depth + 1 > MAX_DEPTH:
                raise LimitError(f"nested deeper than {MAX_DEPTH} levels (limit MAX_DEPTH)")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def _check_event_depth(text: str) -> None:
    depth = 0
    try:
        for event in yaml.parse(text, Loader=_EVENT_LOADER):
            depth = _step_depth(event, depth)
    except yaml.YAMLError as exc:
        if "nesting depth" in str(exc):  # libyaml's own cap (1000) met while scanning ahead
            raise LimitError(f"nested deeper than {MAX_DEPTH} levels (limit MAX_DEPTH)") from None
        raise


def _step_depth(event: yaml.Event, depth: int) -> int:
    if isinstance(event, yaml.CollectionStartEvent):
        depth += 1
        if depth > MAX_DEPTH:
            line = event.start_mark.line + 1 if event.start_mark else "?"
            raise LimitError(
                f"nested deeper than {MAX_DEPTH} levels at line {line} (limit MAX_DEPTH)"
            )
    elif isinstance(event, yaml.CollectionEndEvent):
        depth -= 1
    return depth


def _expanded_size(
    node: yaml.Node, memo: dict[int, tuple[int, int]], open_nodes: set[int], depth: int = 0
) -> tuple[int, int]:
    """(nodes, height) under ``node`` with aliases expanded, memoised per node (linear in the
    graph); ``depth`` is where this use of the node sits, so reuse deep down is still bounded."""
    key = id(node)
    if key in memo:
        size, height = memo[key]
        if depth + height > MAX_DEPTH:
            raise LimitError(
                f"nested deeper than {MAX_DEPTH} levels via an alias (limit MAX_DEPTH)"
            )
        return size, height
    if key in open_nodes:
        raise LimitError("an alias refers to a node that contains it (cyclic document)")
    if isinstance(node, yaml.MappingNode):
        children = [child for pair in node.value for child in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = node.value
    else:
        memo[key] = (1, 0)
        return 1, 0
    if depth + 1 > MAX_DEPTH:
        raise LimitError(f"nested deeper than {MAX_DEPTH} levels (limit MAX_DEPTH)")
    open_nodes.add(key)
    size, height = 1, 1
    for child in children:
        child_size, child_height = _expanded_size(child, memo, open_nodes, depth + 1)
        size, height = size + child_size, max(height, child_height + 1)
        if size > MAX_NODES:
            raise LimitError(
                f"more than {MAX_NODES} values once aliases are expanded (limit MAX_NODES)"
            )
    open_nodes.discard(key)
    memo[key] = (size, height)
    return size, height
