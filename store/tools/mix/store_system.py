"""The store as a system of the mix: every operation is one public `Store` call."""

from __future__ import annotations

import contextlib
from typing import Any

from store.exceptions import NotFound
from store.store import Store
from store.tools.mix.system import PageRows, flush_redis

__all__ = ["StoreSystem"]


class StoreSystem:
    """`Store` calls, nothing else (see `store.tools.mix.system.System`)."""

    #: A board page is filled past gone pins (`Store.board_pins`).
    fills_pages = True

    def __init__(self, store: Store, *, name: str = "store") -> None:
        self.store = store
        self.name = name

    def get_node(self, id_: int, type_name: str | None = None) -> dict[str, Any] | None:
        """`Store.get`."""
        return self.store.get(id_, type_name=type_name)

    def add_node(self, type_name: str, data: dict[str, Any], near: int) -> int:
        """`Store.create` near ``near``."""
        return self.store.create(type_name, data, near=near)

    def update_node(self, id_: int, changes: dict[str, Any], type_name: str | None = None) -> None:
        """`Store.update` (a gone object is a no-op, as for the others)."""
        with contextlib.suppress(NotFound):
            self.store.update(id_, changes, type_name=type_name)

    def delete_node(self, id_: int, type_name: str | None = None) -> None:
        """`Store.delete` (which also empties the object's lists)."""
        self.store.delete(id_, type_name=type_name)

    def board_page(self, board_id: int, limit: int) -> PageRows:
        """`Store.board_pins`."""
        page = self.store.board_pins(board_id, limit=limit)
        return list(zip(page.ids, page.objects, strict=True))

    def link_ids(self, relation: str, from_id: int, limit: int) -> list[int]:
        """`Store.page`'s ids."""
        return self.store.page(relation, from_id, limit=limit).ids

    def count_links(self, relation: str, from_id: int) -> int:
        """`Store.count`."""
        return self.store.count(relation, from_id)

    def add_link(self, relation: str, from_id: int, to_id: int, sequence: int) -> None:
        """`Store.link` (its own clock: an existing pair keeps its place).

        A deleted pin is refused (`NotFound`), as the store promises: an
        answer, not an error of the run.
        """
        with contextlib.suppress(NotFound):
            self.store.link(relation, from_id, to_id)

    def update_link(self, relation: str, from_id: int, to_id: int, sequence: int) -> None:
        """`Store.link` with ``sequence`` (moves the pair; a deleted pin is refused, as above)."""
        with contextlib.suppress(NotFound):
            self.store.link(relation, from_id, to_id, sequence=sequence)

    def delete_link(self, relation: str, from_id: int, to_id: int) -> None:
        """`Store.unlink`."""
        self.store.unlink(relation, from_id, to_id)

    def has_link(self, relation: str, from_id: int, to_id: int) -> bool:
        """`Store.has_link`."""
        return self.store.has_link(relation, from_id, to_id)

    def flush(self) -> None:
        """Drop the store's Redis lists (memcached is flushed by the runner)."""
        c = self.store.config.cache
        for url in c.redis:
            flush_redis(url, c.prefix)

    def close(self) -> None:
        """`Store.close`."""
        self.store.close()
