"""Named entries registered once each, by decorator: cost models, zoo models."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries by name; registering a name twice fails, so two modules cannot shadow each other.

    Example:
        >>> models: Registry[int] = Registry("model")
        >>> models.register("one")(1)
        1
        >>> models.names()
        ['one']
    """

    def __init__(self, what: str, sort: bool = True) -> None:
        """``what`` the entries are, for messages; ``sort``: list names sorted, else as registered."""
        self.what = what
        self.sort = sort
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """A decorator adding its argument under ``name``."""

        def decorator(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.what} {name!r} is already registered")
            self._entries[name] = entry
            return entry

        return decorator

    def get(self, name: str) -> T:
        """The entry of ``name``.

        Raises:
            ValueError: no entry has that name; the message lists those that do.
        """
        if name not in self._entries:
            raise ValueError(f"unknown {self.what} {name!r}; registered: {', '.join(self.names())}")
        return self._entries[name]

    def names(self) -> list[str]:
        """The registered names."""
        return sorted(self._entries) if self.sort else list(self._entries)
