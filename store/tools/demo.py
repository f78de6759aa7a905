"""`store demo`: create users, boards and pins, link and page them, time each step."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from store.ids import decode_pinterest
from store.store import Store

__all__ = ["run_demo"]


def run_demo(store: Store, *, say: Callable[[str], None] = print, pins_per_board: int = 20) -> None:
    """Walk through the object API on ``store``, printing what it does and how long it took."""

    @contextmanager
    def step(what: str) -> Iterator[None]:
        t = time.perf_counter()
        yield
        say(f"  {(time.perf_counter() - t) * 1000:8.1f} ms  {what}")

    cfg = store.config
    say(f"store with {cfg.shards} shards on {len(cfg.hosts)} host(s): {', '.join(cfg.hosts)}")
    with step("created 3 users on random open shards"):
        users = [store.create("user", {"name": n}) for n in ("ada", "grace", "edsger")]
    with step("created one board per user, each on its user's shard"):
        boards = [
            store.create("board", {"name": f"board {i}", "owner": u}, near=u) for i, u in enumerate(users)
        ]
    with step(f"created {pins_per_board} pins per board, each on its board's shard"):
        pins = [
            store.create("pin", {"title": f"pin {j} of board {i}", "board": b}, near=b)
            for i, b in enumerate(boards)
            for j in range(pins_per_board)
        ]
    pin = pins[0]
    shard, type_id, local_id = decode_pinterest(pin)
    loc = store.locate(pin)
    say(f"  pin {pin} = shard {shard}, type {type_id} ({loc.type.name}), local id {local_id}")
    say(f"  it lives in {loc.type.table} of shard {shard} on host {loc.host}")
    with step("read that pin by ID alone"):
        got = store.get(pin)
    say(f"             -> {got}")
    with step(f"read all {len(pins)} pins with get_many (one query per host or shard)"):
        many = store.get_many(pins)
    say(f"             -> {len(many)} objects")
    with step("8 read-modify-write updates of one counter"):
        for _ in range(8):
            store.update(boards[0], lambda b: {**b, "views": b.get("views", 0) + 1})
    say(f"             -> board views = {store.get(boards[0], type_name='board')['views']}")  # type: ignore[index]
    if "board_has_pins" in cfg.relations:
        first = pins[:pins_per_board]
        with step(f"linked {len(first)} pins to board 0 (and each pin back to its board)"):
            for p in first:
                store.link("board_has_pins", boards[0], p)
        with step("read board 0's first page of 8 pins with their objects (2 queries)"):
            page = store.board_pins(boards[0], limit=8)
        say(f"             -> {[o['title'] for o in page.objects[:3]]} ... ({len(page.ids)} pins)")
        with step("read the next page by cursor"):
            page2 = store.board_pins(boards[0], limit=8, cursor=page.next_cursor)
        say(f"             -> starts at {page2.objects[0]['title']!r}")
        with step("counted board 0's pins (one key read, no scan)"):
            n = store.count("board_has_pins", boards[0])
        say(f"             -> {n} pins; pin 0 is on boards {store.links('pin_owned_by_board', first[0])}")
    with step("soft-deleted one pin"):
        store.delete(pins[-1])
    say(f"             -> get now returns {store.get(pins[-1])}")
