"""The node's subscription index: topic filters in a trie of levels.

Each node stands for a filter prefix.  Literal levels lead to ``children`` (a dict keyed by the
level text, ``""`` included); a ``+`` level leads to the separate ``plus`` child; a ``#`` level,
always the last, is not a node at all: its subscribers sit in ``hash`` on the node of its
parent prefix.  ``subs`` holds the subscribers whose filter ends exactly at the node.

Invariants:

* every ``(filter, key)`` pair is stored once, with its granted QoS; ``len()`` counts pairs;
* a node with no subscribers and no children is never kept: removal prunes upwards;
* :meth:`SubscriptionTrie.match` walks only the branches the topic can follow (the literal
  child, ``plus`` and ``hash`` of each visited node), never every subscription, and returns each
  subscriber once with the highest QoS of its matching filters (MQTT 3.1.1 section 3.3.5);
* a topic starting with ``$`` is not matched through a wildcard at the first level
  [MQTT-4.7.2-1].

Filters must be valid plain filters (:func:`mqttcore.topics.is_valid_filter`); a shared
subscription is stored under its real filter, with the caller's choice of key.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)


_NO_CHILDREN: Mapping[str, Any] = MappingProxyType({})
"""What a leaf's ``children`` are: one shared, read-only empty mapping (a fleet's filters end in
a leaf each, and an empty dict takes 64 bytes)."""


class _Node(Generic[K]):
    """One filter prefix: its literal children, its ``+`` child and its subscribers."""

    __slots__ = ("children", "hash", "plus", "subs")

    def __init__(self) -> None:
        self.children: Mapping[str, _Node[K]] = _NO_CHILDREN
        self.plus: _Node[K] | None = None
        self.hash: dict[K, int] | None = None
        self.subs: dict[K, int] | None = None

    def is_empty(self) -> bool:
        return not (self.children or self.plus or self.hash or self.subs)

    def child(self, level: str) -> _Node[K] | None:
        return self.plus if level == "+" else self.children.get(level)

    def child_or_new(self, level: str) -> _Node[K]:
        node = self.child(level)
        if node is None:
            node = _Node()
            if level == "+":
                self.plus = node
            else:
                children = self.children if isinstance(self.children, dict) else {}
                children[level] = node
                self.children = children
        return node

    def drop_child(self, level: str) -> None:
        if level == "+":
            self.plus = None
        else:
            assert isinstance(self.children, dict)
            del self.children[level]
            if not self.children:
                self.children = _NO_CHILDREN


class SubscriptionTrie(Generic[K]):
    """Subscriptions of one node, keyed by subscriber, looked up by topic name."""

    __slots__ = ("_count", "_root")

    def __init__(self) -> None:
        self._root: _Node[K] = _Node()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def is_empty(self) -> bool:
        return self._count == 0

    def add(self, filter: str, key: K, qos: int) -> bool:
        """Subscribe ``key`` to ``filter``; False if it was subscribed and only its QoS changed."""
        if not 0 <= qos <= 2:
            raise ValueError(f"QoS must be 0, 1 or 2, not {qos}")
        node = self._root
        levels = filter.split("/")
        for level in levels[:-1]:
            node = node.child_or_new(level)
        subs = self._leaf_subs(node, levels[-1])
        new = key not in subs
        subs[key] = qos
        if new:
            self._count += 1
        return new

    def remove(self, filter: str, key: K) -> bool:
        """Unsubscribe ``key`` from ``filter``; False if it was not subscribed."""
        levels = filter.split("/")
        path = self._find_path(levels)
        if path is None or not self._discard(path[-1], levels[-1], key):
            return False
        self._count -= 1
        self._prune(path, levels)
        return True

    def match(self, topic: str) -> dict[K, int]:
        """Each subscriber with a filter matching ``topic``, once, with its highest QoS."""
        levels = topic.split("/")
        out: dict[K, int] = {}
        if topic[:1] == "$":
            start = self._root.children.get(levels[0])
            if start is not None:
                _walk(start, levels, 1, out)
        else:
            _walk(self._root, levels, 0, out)
        return out

    def filters(self) -> Iterator[str]:
        """Every distinct filter with at least one subscriber, in no particular order.

        A lazy walk: do not add or remove subscriptions until it is exhausted.
        """
        if self._root.hash:
            yield "#"
        path: list[str] = []
        stack = [_edges(self._root)]
        while stack:
            edge = next(stack[-1], None)
            if edge is None:
                stack.pop()
                if path:
                    path.pop()
                continue
            level, node = edge
            path.append(level)
            if node.subs:
                yield "/".join(path)
            if node.hash:
                yield "/".join([*path, "#"])
            stack.append(_edges(node))

    @staticmethod
    def _leaf_subs(parent: _Node[K], last: str) -> dict[K, int]:
        if last == "#":
            if parent.hash is None:
                parent.hash = {}
            return parent.hash
        leaf = parent.child_or_new(last)
        if leaf.subs is None:
            leaf.subs = {}
        return leaf.subs

    def _find_path(self, levels: list[str]) -> list[_Node[K]] | None:
        """The nodes from the root to the parent of the last level, if they all exist."""
        path = [self._root]
        for level in levels[:-1]:
            node = path[-1].child(level)
            if node is None:
                return None
            path.append(node)
        return path

    @staticmethod
    def _discard(parent: _Node[K], last: str, key: K) -> bool:
        is_hash = last == "#"
        holder = parent if is_hash else parent.child(last)
        if holder is None:
            return False
        subs = holder.hash if is_hash else holder.subs
        if subs is None or key not in subs:
            return False
        del subs[key]
        if not subs:
            _clear(holder, is_hash)
        return True

    @staticmethod
    def _prune(path: list[_Node[K]], levels: list[str]) -> None:
        """Unlink the now-empty nodes on ``path``, from the deepest up."""
        parent = path[-1]
        last = levels[-1]
        if last != "#":
            leaf = parent.child(last)
            if leaf is not None and leaf.is_empty():
                parent.drop_child(last)
        for depth in range(len(path) - 1, 0, -1):
            if not path[depth].is_empty():
                return
            path[depth - 1].drop_child(levels[depth - 1])


def _edges(node: _Node[K]) -> Iterator[tuple[str, _Node[K]]]:
    yield from node.children.items()
    if node.plus is not None:
        yield "+", node.plus


def _clear(node: _Node[K], hash_subs: bool) -> None:
    if hash_subs:
        node.hash = None
    else:
        node.subs = None


def _walk(node: _Node[K], levels: list[str], i: int, out: dict[K, int]) -> None:
    """Collect into ``out`` the subscribers under ``node`` matching ``levels[i:]``.

    Literal children are followed in a loop; ``plus`` branches wait on an explicit stack, so
    a deep topic cannot exhaust the interpreter's recursion limit.
    """
    n = len(levels)
    pending: list[tuple[_Node[K], int]] = []
    current: _Node[K] | None = node
    while True:
        while current is not None:
            if current.hash:
                _merge(current.hash, out)
            if i == n:
                if current.subs:
                    _merge(current.subs, out)
                break
            if current.plus is not None:
                pending.append((current.plus, i + 1))
            current = current.children.get(levels[i])
            i += 1
        if not pending:
            return
        current, i = pending.pop()


def _merge(subs: dict[K, int], out: dict[K, int]) -> None:
    """Fold ``subs`` into ``out``, keeping the highest QoS per subscriber."""
    if not out:
        out.update(subs)
        return
    get = out.get
    for key, qos in subs.items():
        if get(key, -1) < qos:
            out[key] = qos
