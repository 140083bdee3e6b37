"""``Registry``: named implementations of one kind (policies, losses, engines, advantage
modes), added with a decorator. A config field whose values are a registry's names takes
``choices=REGISTRY`` (a live view: what is registered is what the config accepts), so an
unknown name is refused by the config, naming the field, before anything runs."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """``name -> implementation``, in registration order; read-only but for ``register``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """A decorator adding its target under ``name``; a name is registered once."""

        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"a {self.kind} named {name!r} is already registered")
            self._entries[name] = entry
            return entry

        return add

    def lookup(self, name: str) -> T:
        """The entry ``name``, or ``ValueError`` listing the registered names."""
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(self._entries)
            raise ValueError(f"unknown {self.kind} {name!r}; expected one of {known}") from None

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"
