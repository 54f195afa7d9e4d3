"""Reading YAML documents while keeping the line of every node: the "where in the file" concern.

A contract problem is only useful if it points at the line to fix, but ``yaml.safe_load`` returns
plain data that has forgotten where it came from. So each document is first composed into nodes,
which carry their marks, indexed by path (mapping keys and list indices), and only then
constructed into data. The same walk catches what PyYAML would silently accept: a repeated key
(PyYAML keeps the last one) and a document that aliases its way to millions of values.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml

from effectflow import errors

_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"

#: Where a node sits in a document: mapping keys and list indices from the root.
NodePath = tuple[object, ...]
#: More values than any contract file needs; beyond it a document is refused unread.
_MAX_VALUES = 20_000


class Lines:
    """1-based lines of one document's nodes, by path (mapping keys and list indices)."""

    def __init__(self) -> None:
        #: Line of the key (or list item) that introduces the node at a path.
        self.keys: dict[NodePath, int] = {}
        #: Line where the node's value starts (used for the document root).
        self.values: dict[NodePath, int] = {}

    def at(self, path: NodePath) -> int:
        """The line of ``path``'s key, else of its value, else of its nearest recorded parent.

        Parents stand in for values that have no node of their own: keys merged in with ``<<``,
        or the inside of an alias.
        """
        for end in range(len(path), -1, -1):
            prefix = path[:end]
            line = self.keys.get(prefix) or self.values.get(prefix)
            if line is not None:
                return line
        return 1


@dataclasses.dataclass(frozen=True)
class Document:
    data: Any
    lines: Lines


def read_documents(
    text: str, filename: str, problems: list[errors.ContractProblem]
) -> list[Document]:
    """Every document up to the first YAML error, which becomes a problem with its line."""
    documents: list[Document] = []
    loader: yaml.SafeLoader | None = None
    try:
        loader = yaml.SafeLoader(text)
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                break
            if _expanded_size(node, {}, set()) > _MAX_VALUES:
                message = (
                    f"the document expands to more than {_MAX_VALUES} values through aliases; "
                    "write the contracts out"
                )
                problems.append(
                    errors.ContractProblem(filename, node.start_mark.line + 1, "<yaml>", message)
                )
                continue
            lines = Lines()
            # Index before constructing: construction flattens ``<<`` merges into the nodes,
            # which would make merged keys look like duplicates.
            _index(loader, node, (), None, lines, _Walk(filename, problems))
            documents.append(Document(loader.construct_document(node), lines))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = f"YAML syntax: {exc.problem or exc.context}"
        if exc.problem and exc.context and exc.context_mark is not None:
            message += f" ({exc.context} on line {exc.context_mark.line + 1})"
        line = mark.line + 1 if mark is not None else 1
        problems.append(errors.ContractProblem(filename, line, "<yaml>", message))
    except RecursionError:
        message = "nested too deeply to read; contract files need only a few levels"
        problems.append(errors.ContractProblem(filename, 1, "<yaml>", message))
    except yaml.reader.ReaderError as exc:
        line = text[: exc.position].count("\n") + 1
        problems.append(errors.ContractProblem(filename, line, "<yaml>", f"YAML: {exc.reason}"))
    finally:
        if loader is not None:
            loader.dispose()
    return documents


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """How many values the node becomes once aliases are expanded, without expanding them.

    A few aliases can stand for millions of values ("billion laughs"); validating those would
    take minutes, as every schema error message prints its value.
    """
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_nodes:
        return 1  # a recursive alias: Python keeps it as one shared object
    open_nodes.add(id(node))
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [child for pair in node.value for child in pair]
    total = 1 + sum(_expanded_size(child, sizes, open_nodes) for child in children)
    open_nodes.discard(id(node))
    sizes[id(node)] = total
    return total


@dataclasses.dataclass
class _Walk:
    filename: str
    problems: list[errors.ContractProblem]
    #: Nodes already indexed: an alias is not walked again (no blow-up, no endless recursion).
    visited: set[int] = dataclasses.field(default_factory=set)


def _index(
    loader: yaml.SafeLoader,
    node: yaml.Node,
    path: NodePath,
    key_line: int | None,
    lines: Lines,
    walk: _Walk,
) -> None:
    if key_line is not None:
        lines.keys[path] = key_line
    lines.values[path] = node.start_mark.line + 1
    if id(node) in walk.visited:
        return
    walk.visited.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for position, item in enumerate(node.value):
            _index(loader, item, (*path, position), item.start_mark.line + 1, lines, walk)
    elif isinstance(node, yaml.MappingNode):
        first_line: dict[object, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = _key_of(loader, key_node)
            line = key_node.start_mark.line + 1
            if key in first_line:
                walk.problems.append(
                    errors.ContractProblem(
                        walk.filename,
                        line,
                        dotted((*path, key)),
                        f"given twice (first on line {first_line[key]}); keep one",
                    )
                )
            # The data keeps the last value, so the last key's line is the one to point at.
            first_line.setdefault(key, line)
            _index(loader, value_node, (*path, key), line, lines, walk)


def _key_of(loader: yaml.SafeLoader, node: yaml.Node) -> object:
    """The key as the constructed data holds it (``1:`` is the int 1), so schema paths match."""
    if isinstance(node, yaml.ScalarNode) and node.tag == _STR_TAG:
        return node.value
    try:
        key: object = loader.construct_object(node)
        hash(key)
    except (yaml.YAMLError, ValueError, TypeError):
        return node.value
    return key


def dotted(path: NodePath) -> str:
    """``side_effect_contract.completion.states[1]``; list indices of a top-level list dropped."""
    if path and isinstance(path[0], int):
        path = path[1:]
    out = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "<item>"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One schema-valid item, with what is needed to point at its fields."""

    filename: str
    kind: str
    body: dict[str, Any]
    lines: Lines
    base: NodePath
    #: Paths where the schema found a problem (the field itself, or a missing or unknown key).
    broken: frozenset[NodePath]

    def sound(self, *fields: str) -> bool:
        """Whether the schema found nothing wrong at, above or inside ``fields``."""
        target = (*self.base, *fields)
        return not any(
            target[: len(bad)] == bad or bad[: len(target)] == target for bad in self.broken
        )

    def line(self, *fields: str) -> int:
        return self.lines.at((*self.base, *fields))

    def field(self, *fields: str) -> str:
        return ".".join((self.kind, *fields))

    def problem(self, fields: tuple[str, ...], message: str) -> errors.ContractProblem:
        return errors.ContractProblem(
            self.filename, self.line(*fields), self.field(*fields), message
        )

    def get(self, *fields: str) -> Any:
        value: Any = self.body
        for name in fields:
            if not isinstance(value, dict):
                return None
            value = value.get(name)
        return value
