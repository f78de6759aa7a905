"""A read workload whose every answer can be checked: for the fork tests and the WSGI app.

`seed` writes boards with pins (each pin's data names its own ID, so an
answer meant for another request cannot pass for the right one) and
records what was written in a JSON file; `Known.check` runs one random
read (a get, a get_many, a page or a board page with its pins) and says
whether the answer is what was written.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from store import Store

#: Each pin's data: its own ID in it, and some padding so rows differ in size.
PAD = "x" * 40


@dataclass
class Known:
    """What `seed` wrote: each pin's data by ID, each board's pins in list order."""

    pins: dict[int, dict[str, Any]]
    boards: dict[int, list[int]]

    @classmethod
    def load(cls, path: Path) -> Known:
        """Read what `save` wrote."""
        raw = json.loads(path.read_text())
        return cls(
            {int(k): v for k, v in raw["pins"].items()},
            {int(k): [int(i) for i in v] for k, v in raw["boards"].items()},
        )

    def save(self, path: Path) -> None:
        """Write it as JSON (IDs as strings)."""
        path.write_text(json.dumps({"pins": self.pins, "boards": self.boards}))

    def warm(self, store: Store) -> None:
        """Read everything once (fills the caches, opens pooled connections)."""
        ids = list(self.pins)
        for i in range(0, len(ids), 50):
            store.get_many(ids[i : i + 50], type_name="pin")
        for pin in ids[:20]:
            store.get(pin, type_name="pin")
        for board in self.boards:
            store.page("board_has_pins", board, limit=10)
            store.board_pins(board, limit=10)

    def check(self, store: Store, rng: random.Random) -> str | None:
        """One random read; None if its answer is right, else what was wrong."""
        kind = rng.randrange(4)
        if kind == 0:
            pin = rng.choice(list(self.pins))
            got = store.get(pin, type_name="pin")
            return None if got == self.pins[pin] else f"get({pin}) = {got!r}"
        if kind == 1:
            ids = rng.sample(list(self.pins), 12)
            many = store.get_many(ids, type_name="pin")
            if many == {i: self.pins[i] for i in ids}:
                return None
            return f"get_many: wrong for {sorted(i for i in ids if many.get(i) != self.pins[i])}"
        board = rng.choice(list(self.boards))
        limit = rng.choice((5, 10, 25))
        want = self.boards[board][:limit]
        if kind == 2:
            page = store.page("board_has_pins", board, limit=limit)
            return None if page.ids == want else f"page({board}) = {page.ids}"
        page = store.board_pins(board, limit=limit)
        if page.ids == want and page.objects == [self.pins[i] for i in want]:
            return None
        return f"board_pins({board}) = {page.ids}"

    def answer(self, store: Store, path: str) -> Any:
        """The JSON answer of the WSGI app (`tests.wsgi_app`) for ``path``: /pin/ID, /pins/ID,ID,
        /page/BOARD/LIMIT, /board/BOARD/LIMIT."""
        _, kind, arg, *rest = path.split("/")
        if kind == "pin":
            return store.get(int(arg), type_name="pin")
        if kind == "pins":
            many = store.get_many([int(i) for i in arg.split(",")], type_name="pin")
            return {str(k): v for k, v in many.items()}
        limit = int(rest[0])
        if kind == "page":
            return store.page("board_has_pins", int(arg), limit=limit).ids
        page = store.board_pins(int(arg), limit=limit)
        return {"ids": page.ids, "objects": page.objects}

    def request(self, rng: random.Random) -> tuple[str, Any]:
        """A random path for the WSGI app and the answer it must give."""
        kind = rng.randrange(4)
        if kind == 0:
            pin = rng.choice(list(self.pins))
            return f"/pin/{pin}", self.pins[pin]
        if kind == 1:
            ids = rng.sample(list(self.pins), 12)
            return "/pins/" + ",".join(map(str, ids)), {str(i): self.pins[i] for i in ids}
        board = rng.choice(list(self.boards))
        limit = rng.choice((5, 10, 25))
        want = self.boards[board][:limit]
        if kind == 2:
            return f"/page/{board}/{limit}", want
        return f"/board/{board}/{limit}", {"ids": want, "objects": [self.pins[i] for i in want]}


def seed(store: Store, *, boards: int = 12, pins_per_board: int = 30) -> Known:
    """Boards with pins on their shards, linked in order; what was written."""
    pins: dict[int, dict[str, Any]] = {}
    lists: dict[int, list[int]] = {}
    for b in range(boards):
        board = store.create("board", {"name": f"board {b}"})
        lists[board] = []
        for p in range(pins_per_board):
            pin = store.create("pin", {"n": p, "board": board, "pad": PAD[: 10 + p % 30]}, near=board)
            # Its own ID is in its data: an answer meant for another pin never matches.
            data = {"n": p, "board": board, "pad": PAD[: 10 + p % 30], "id": pin}
            store.update(pin, data, type_name="pin")
            pins[pin] = data
            store.link("board_has_pins", board, pin, sequence=p + 1)
            lists[board].append(pin)
    return Known(pins, lists)
