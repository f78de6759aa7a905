"""The mix's floor keeps one set of connections per live thread, handed on when threads end.

Pure logic (no server is reached: the sets are only counted). The mix runs each
phase in slices, each with new threads; thread idents are reused, and a set
left under an ended thread's ident once leaked its connections (16 threads x
6 slices ran a 400-connection server out of connections).
"""

from __future__ import annotations

import threading
from typing import Any

from store.tools.mix.floor import Floor
from store.tools.mix.system import MixSchema


def _floor() -> Floor:
    schema = MixSchema(
        hosts={"A": "mysql+pymysql://root@127.0.0.1:1"},
        masters={0: "A"},
        types={"pin": (1, "pins")},
        relations={},
    )
    return Floor(schema, memcached=["127.0.0.1:1"], redis_url="redis://127.0.0.1:1/0")


def test_connection_sets_are_handed_on_and_never_shared_or_left_behind() -> None:
    """Slices of 2 to 16 threads, 30 times: the threads alive at once each hold a set of their own;
    every set the floor made is still there to hand on (none left open, unused); and there are
    never more sets than threads at once."""
    floor = _floor()
    made: set[int] = set()
    lock = threading.Lock()

    def work(start: threading.Barrier, held: list[int]) -> None:
        start.wait()
        mine: dict[str, Any] = floor._mine()
        marker = id(mine.setdefault("marker", object()))
        with lock:
            made.add(marker)
            held.append(marker)
        start.wait()  # (every thread of the slice holds its set at once)

    for threads in (4, 16, 4, 16, 2) * 6:  # a run's slices: new threads each time
        start = threading.Barrier(threads)
        held: list[int] = []
        ts = [threading.Thread(target=work, args=(start, held)) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert len(set(held)) == threads, "two threads alive at once share one set of connections"
        owned = {id(m["marker"]) for m in floor._owned.values()}
        assert owned == made, f"{len(made - owned)} set(s) left behind, their connections open"
    assert len(made) <= 16
