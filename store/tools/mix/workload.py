"""The mix's data set and request stream, both made from a seed, in data-set indices.

The data set is Pinterest-shaped: users, boards per user (on the user's
shard), pins spread over boards by a Zipf law (so the hottest board holds a
few thousand pins; each pin on its board's shard), and likes (each user likes
pins picked by popularity). Every system loads its own copy of it (same
shape, its own IDs), and thread ``t`` of every system replays the same
request stream, made from ``seed`` and ``t``.

The operation mix is LinkBench's (its FBWorkload.properties), mapped onto
boards, pins and likes; "from" objects of link operations are picked by a
Zipf law of shape 0.8 over boards ranked by size, nodes by shape 0.625.
"""

from __future__ import annotations

import functools
import random
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

__all__ = ["MIX", "DataSet", "Request", "Shape", "Zipf", "make_data_set", "requests"]

#: LinkBench's operation mix, in percent, with get_link_list split 9:1 into board pages and likes pages.
MIX: dict[str, float] = {
    "board_page": 50.71 * 0.9,
    "likes_page": 50.71 * 0.1,
    "get_node": 12.93,
    "add_link": 8.99,
    "update_link": 8.01,
    "update_node": 7.37,
    "count_link": 4.89,
    "delete_link": 2.99,
    "add_node": 2.57,
    "delete_node": 1.01,
    "get_link": 0.53,
}
LINK_SHAPE = 0.8
NODE_SHAPE = 0.625
PAGE = 50


@dataclass(frozen=True)
class Shape:
    """How big the data set is."""

    users: int = 2000
    boards_per_user: int = 2
    pins: int = 40000
    likes_per_user: int = 10
    #: The Zipf shape of pins over boards (1.0: the biggest board holds about 1/ln(boards) of them).
    pins_shape: float = 1.0
    seed: int = 1

    @property
    def boards(self) -> int:
        """How many boards there are."""
        return self.users * self.boards_per_user


class Zipf:
    """Ranks 0..n-1 with P(rank r) proportional to 1 / (r + 1) ** shape (inverse-CDF by bisection)."""

    def __init__(self, n: int, shape: float) -> None:
        if n < 1:
            raise ValueError("a Zipf law needs at least one rank")
        self._cdf = list(accumulate(1.0 / (r + 1) ** shape for r in range(n)))
        self._total = self._cdf[-1]
        self.n = n

    def sample(self, rng: random.Random) -> int:
        """One rank."""
        return min(bisect_right(self._cdf, rng.random() * self._total), self.n - 1)


@functools.lru_cache(maxsize=16)
def zipf(n: int, shape: float) -> Zipf:
    """The `Zipf` law of ``n`` ranks, made once and shared (it only reads its table): each request
    stream needs three, and 256 streams each making its own (6 ms) held a phase of 256 tasks'
    event loop for 1.6 s."""
    return Zipf(n, shape)


@dataclass
class DataSet:
    """The data set in indices: who owns what, and which pairs exist at the start."""

    shape: Shape
    #: user index of each board.
    board_owner: list[int]
    #: board index of each pin.
    pin_board: list[int]
    #: pin indices of each board, in list order.
    board_pins: list[list[int]]
    #: pin indices each user likes, in list order.
    user_likes: list[list[int]]
    #: boards ranked by size, biggest first (rank -> board index).
    boards_by_size: list[int]
    #: pins ranked by popularity (rank -> pin index).
    pins_by_rank: list[int]
    #: users ranked by activity (rank -> user index).
    users_by_rank: list[int]

    def user_data(self, u: int) -> dict[str, Any]:
        """The object of user ``u``."""
        return {"username": f"user{u}", "name": f"User {u}", "bio": "x" * 40}

    def board_data(self, b: int) -> dict[str, Any]:
        """The object of board ``b``."""
        return {"name": f"board {b}", "owner": self.board_owner[b], "description": "y" * 60}

    def pin_data(self, p: int) -> dict[str, Any]:
        """The object of pin ``p`` (about 200 bytes of JSON)."""
        return {
            "title": f"pin {p}",
            "board": self.pin_board[p],
            "url": f"https://img.example/{p:08d}.jpg",
            "note": "z" * 80,
            "n": 0,
        }


def make_data_set(shape: Shape) -> DataSet:
    """The data set of ``shape``, the same for the same shape and seed."""
    rng = random.Random(shape.seed)
    boards = shape.boards
    board_owner = [b // shape.boards_per_user for b in range(boards)]
    boards_by_size = list(range(boards))
    rng.shuffle(boards_by_size)
    by_size = Zipf(boards, shape.pins_shape)
    pin_board = [boards_by_size[by_size.sample(rng)] for _ in range(shape.pins)]
    board_pins: list[list[int]] = [[] for _ in range(boards)]
    for p, b in enumerate(pin_board):
        board_pins[b].append(p)
    boards_by_size.sort(key=lambda b: -len(board_pins[b]))
    pins_by_rank = list(range(shape.pins))
    rng.shuffle(pins_by_rank)
    users_by_rank = list(range(shape.users))
    rng.shuffle(users_by_rank)
    popular = Zipf(shape.pins, NODE_SHAPE)
    user_likes: list[list[int]] = []
    for _u in range(shape.users):
        liked: dict[int, None] = {}
        while len(liked) < min(shape.likes_per_user, shape.pins):
            liked[pins_by_rank[popular.sample(rng)]] = None
        user_likes.append(list(liked))
    return DataSet(
        shape, board_owner, pin_board, board_pins, user_likes, boards_by_size, pins_by_rank, users_by_rank
    )


@dataclass(frozen=True, slots=True)
class Request:
    """One operation of the stream: its name and its arguments, in data-set indices.

    ``a`` is the "from" object (a board or user index, or the node's pin
    index), ``b`` the "to" pin index where there is one; ``kind`` says which
    relation or which node type.
    """

    op: str
    kind: str
    a: int
    b: int = -1
    value: int = 0


def requests(data: DataSet, seed: int, thread: int) -> Iterator[Request]:
    """Thread ``thread``'s endless request stream: the same for every system."""
    rng = random.Random(seed * 1_000_003 + thread)
    ops = list(MIX)
    cum = list(accumulate(MIX[o] for o in ops))
    total = cum[-1]
    s = data.shape
    boards = zipf(s.boards, LINK_SHAPE)
    users = zipf(s.users, LINK_SHAPE)
    pins = zipf(s.pins, NODE_SHAPE)

    def board() -> int:
        return data.boards_by_size[boards.sample(rng)]

    def user() -> int:
        return data.users_by_rank[users.sample(rng)]

    def pin() -> int:
        return data.pins_by_rank[pins.sample(rng)]

    while True:
        op = ops[min(bisect_right(cum, rng.random() * total), len(ops) - 1)]
        if op == "board_page" or op == "count_link":
            yield Request(op, "board_has_pins", board())
        elif op == "likes_page":
            yield Request(op, "users_likes_pins", user())
        elif op == "get_node":
            yield Request(op, "pin", pin())
        elif op == "update_node":
            yield Request(op, "pin", pin(), value=rng.randrange(1 << 30))
        elif op == "add_node":
            yield Request(op, "pin", board())
        elif op == "delete_node":
            yield Request(op, "pin", rng.randrange(s.pins))
        elif op == "add_link":
            if rng.random() < 0.5:
                yield Request(op, "users_likes_pins", user(), pin())
            else:
                yield Request(op, "board_has_pins", board(), rng.randrange(s.pins))
        elif op == "update_link" or op == "get_link":
            b = board()
            own = data.board_pins[b]
            yield Request(op, "board_has_pins", b, own[rng.randrange(len(own))] if own else 0)
        else:  # delete_link
            u = user()
            liked = data.user_likes[u]
            yield Request(op, "users_likes_pins", u, liked[rng.randrange(len(liked))] if liked else 0)
