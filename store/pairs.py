"""Writing a pair and its inverse so that both sides always end up agreeing.

An inverse pair has two rows on two shards (``board_has_pins`` on the
board's shard, ``pin_owned_by_board`` on the pin's), and no transaction
spans shards. The protocol, for every write of a pair (link, unlink, and
the repair job's re-sync):

1. open a transaction on the primary side (the relation declared with
   ``inverse:``) and write the primary row there. The write locks the pair's
   key on that shard, whether the row is there or not (InnoDB locks the row,
   or the gap where it would be; PostgreSQL takes an advisory lock on the
   key first; SQLite locks the whole shard), until this transaction ends;
2. while holding it, make the inverse row match in a transaction of its own
   on the other shard, and commit that;
3. commit the primary side.

Both connections are taken before either transaction begins, in a fixed
order (`store.engines.transaction_pair`), so writers never hold one pool's
connection while waiting for another's.

Every write of one pair takes the primary key lock first, so writes of a
pair are serialised there, and each writes the inverse side before it lets
the next one in: the inverse side sees the writes in the same order as the
primary side, and both end with the last one. Concurrent link, unlink and
re-link of a pair, in any interleaving, leave both sides and both counts as
the last acknowledged call left them.

A crash between steps 2 and 3 leaves the inverse side ahead of the primary
(which rolled back); a crash of the primary's commit can do the same. Either
way the primary side holds the truth of the last call that could have been
acknowledged, and ``store relations repair`` makes the inverse match it,
under the same lock. When both sides are reached by one connection (a pin
on its board's shard, or two shards of one host), one transaction writes
both and nothing can come apart.

Where a whole shard is locked by a write transaction (SQLite), both shards
are locked up front, in shard order, so two writers never wait for each
other in a circle.

Linking an object that was deleted is refused (`NotFound`): each side reads
its own object's row in share mode under the same transaction, so a link
either commits before the delete marks the object (and the delete's sweep
then finds and removes it) or sees the mark.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from store.backends.statements import ObjectStatements
from store.cache.follower import VERSION_MARK
from store.cache.leases import wall_ms
from store.engines import Cursor, ShardHandle, transaction_pair
from store.exceptions import NotFound

__all__ = ["ADD", "MOVE", "REMOVE", "Change", "Guard", "PairWriter", "Seen", "Side"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Guard:
    """The object row a side's ``from_id`` names: a link is refused if it was deleted."""

    what: str  # "pin 241294492511762325", for the error
    table: str
    key: str  # the row key column: local_id, or id for Instagram IDs
    value: int


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a pair: its row ``from_id -> to_id`` in ``relation`` on ``h``'s shard."""

    h: ShardHandle
    relation: str
    from_id: int
    to_id: int
    guard: Guard | None = None


# What the primary side settled on, for the inverse side to copy:
# (present, sequence); the sequence is unused when the pair is absent.
State = tuple[bool, int]
#: Told the list's new version by the statement that bumped it (`store.engines.Cursor.defer`).
Seen = Callable[[int], None] | None

#: How a side's row changed: the pair is new, moved to another sequence, or removed.
ADD, MOVE, REMOVE = "add", "move", "remove"


@dataclass(slots=True)
class Change:
    """How one side's row changed, for the caller's list cache.

    ``version`` is the list's version that this change made, where the
    backend returns it (`store.backends.Backend.list_versions`); 0 when it
    is not known (the cached list is then dropped, not updated).
    """

    side: Side
    kind: str = ""
    #: The pair's sequence after an add or a move.
    sequence: int = 0
    version: int = 0

    def seen(self, version: int) -> None:
        """Record the version the change's statement returned."""
        self.version = version


class PairWriter:
    """Runs pair writes by the protocol above, with the SQL of a `RelationRepository`."""

    def __init__(self, repo: Any) -> None:
        # `store.relations.RelationRepository` (typed loosely: it imports this module).
        self.repo = repo
        #: Test hook, called at each step of a pair write ("start", "primary written",
        #: "inverse committed"): a test that pauses threads there forces interleavings.
        self.step: Callable[[str], None] | None = None
        #: The invalidation log entries of a side's write (`store.cache.follower`); None: not logged.
        self.log: Callable[[Side], str] | None = None
        self._live_sql: dict[tuple[str, int, str], str] = {}
        self._live_stmts: dict[tuple[str, str, str], ObjectStatements] = {}

    # -- the three writes --------------------------------------------------------

    def link(
        self,
        primary: Side,
        inverse: Side | None,
        sequence: int,
        *,
        move: bool,
        changes: list[Change] | None = None,
    ) -> bool:
        """Add the pair (or move it to ``sequence`` if ``move``); True if it is new.

        ``changes`` gets how each side's row changed (a re-link of a pair
        that is in place on both sides changes none), for the caller's cache.

        The usual cases take one statement a side: a new pair is inserted
        by a statement that also reads the object in share mode
        (``insert_live``), and a move of an existing pair is one UPDATE (no
        object read: the pair exists, so a delete's sweep removes it, or
        has, and then the move finds nothing and takes the slow way). A
        link at a sequence of a pair that is not there is the move, then
        ``insert_live``. The slow way reads the object first, as every link
        once did.
        """
        new = False
        moved = False
        made: list[Change] = []

        def first(cur: Cursor) -> State:
            nonlocal new, moved
            new = moved = False  # (again after a deadlock)
            made.clear()
            self._lock_key(cur, primary)
            c = Change(primary)
            if move and self.repo.move_in(cur, primary, sequence, c.seen):
                moved = True
                self._changed(cur, c, MOVE, sequence, made)
                return True, sequence
            # (a move that found nothing: the pair is absent, or at this sequence already)
            if primary.guard is not None and self.repo.insert_live_in(cur, primary, sequence, c.seen):
                new = True
                self._changed(cur, c, ADD, sequence, made)
                return True, sequence
            self._check_live(cur, primary)
            new, settled = self.repo.add_in(cur, primary, sequence, move=move, seen=c.seen)
            if new or move:
                # (a move asked for by the slow way may or may not have changed the row: count it)
                self._changed(cur, c, ADD if new else MOVE, settled, made)
            return True, settled

        def second(cur: Cursor, state: State) -> None:
            assert inverse is not None
            _present, settled = state
            c = Change(inverse)
            kind: str | None = None
            if new and inverse.guard is not None and self.repo.insert_live_in(cur, inverse, settled, c.seen):
                kind = ADD
            elif moved and self.repo.move_in(cur, inverse, settled, c.seen):
                kind = MOVE
            else:
                self._check_live(cur, inverse)
                kind = self.repo.set_in(cur, inverse, state, c.seen)
            if kind is not None:
                self._changed(cur, c, kind, settled, made)

        self._run(primary, inverse, first, second)
        if changes is not None:
            changes += made
        return new

    def unlink(self, primary: Side, inverse: Side | None, *, changes: list[Change] | None = None) -> bool:
        """Remove the pair; True if it was there. ``changes`` gets how each side's row changed."""
        gone = False
        made: list[Change] = []

        def first(cur: Cursor) -> State:
            nonlocal gone
            made.clear()
            self._lock_key(cur, primary)
            c = Change(primary)
            gone = self.repo.remove_in(cur, primary, c.seen)
            if gone:
                self._changed(cur, c, REMOVE, 0, made)
            return False, 0

        def second(cur: Cursor, state: State) -> None:
            assert inverse is not None
            c = Change(inverse)
            kind = self.repo.set_in(cur, inverse, state, c.seen)
            if kind is not None:
                self._changed(cur, c, kind, state[1], made)

        self._run(primary, inverse, first, second)
        if changes is not None:
            changes += made
        return gone

    def sync(self, primary: Side, inverse: Side) -> bool:
        """Make the inverse row match the primary row as it is now; True if it had to change."""
        changed = False

        def first(cur: Cursor) -> State:
            self._lock_key(cur, primary)
            found = self.repo.locked_sequence(cur, primary)
            return (False, 0) if found is None else (True, found)

        def second(cur: Cursor, state: State) -> None:
            nonlocal changed
            c = Change(inverse)
            kind = self.repo.set_in(cur, inverse, state, c.seen)
            changed = kind is not None
            if kind is not None:
                self._changed(cur, c, kind, state[1], [])

        self._run(primary, inverse, first, second)
        return changed

    # -- the protocol -------------------------------------------------------------

    def _run(
        self,
        primary: Side,
        inverse: Side | None,
        first: Callable[[Cursor], State],
        second: Callable[[Cursor, State], None],
    ) -> None:
        step = self.step or _no_step
        step("start")
        p, i = primary.h, None if inverse is None else inverse.h
        if i is None:
            p.transaction(first)
            return
        if p.pool is i.pool:
            # One pool, one server: one connection reaches both shards (a pin on
            # its board's shard, or two shards of one host), so one transaction
            # writes both sides and nothing can come apart.

            def both(cur: Cursor) -> None:
                state = first(cur)
                step("primary written")
                second(cur, state)

            p.transaction(both)
            return
        transaction_pair(p, i, first, second, step=step)

    def _changed(self, cur: Cursor, c: Change, kind: str, sequence: int, made: list[Change]) -> None:
        """Note how ``c``'s side changed, and log its list for the followers (where the host logs).

        The list goes in the transaction's one log row, with its COMMIT;
        where the backend keeps list versions, with the version the
        transaction leaves the list at (`Backend.change_log_insert_versions`).
        """
        c.kind, c.sequence = kind, sequence
        made.append(c)
        if self.log is None:
            return
        h = c.side.h
        sql = h.log_sql()
        if sql is None:
            return
        if h.backend.list_versions:
            version = self.repo.sql(h, c.side.relation).version_of
            entry = self.log(c.side) + VERSION_MARK
            cur.defer_log_version(sql, wall_ms(), entry, version, (c.side.relation, c.side.from_id))
        else:
            cur.defer_log(sql, wall_ms(), self.log(c.side))

    # -- locks and checks -------------------------------------------------------------

    def _lock_key(self, cur: Cursor, side: Side) -> None:
        lock = side.h.backend.key_lock
        if lock is not None:
            cur.execute(lock, (_key_hash(side.relation, side.from_id, side.to_id),))
            cur.fetchall()

    def _check_live(self, cur: Cursor, side: Side) -> None:
        g = side.guard
        if g is None:
            return
        h = side.h
        key = (h.backend.name, h.shard, g.table)
        sql = self._live_sql.get(key)
        if sql is None:
            kind = (h.backend.name, g.table, g.key)
            stmts = self._live_stmts.get(kind)
            if stmts is None:  # compiled once per backend, not per shard
                ids = "instagram" if g.key == "id" else "pinterest"
                stmts = self._live_stmts[kind] = ObjectStatements(h.backend, g.table, ids=ids)
            sql = self._live_sql[key] = stmts.for_shard(h.shard)["live_shared"]
        cur.execute(sql, (g.value,))
        row = cur.fetchone()
        if row is not None and not row[0]:
            raise NotFound(f"{g.what} was deleted: a deleted object cannot be linked")


def _no_step(_name: str) -> None:
    return None


def _key_hash(relation: str, from_id: int, to_id: int) -> int:
    """A signed 64-bit key for the pair (a collision only makes two pairs wait for each other)."""
    digest = hashlib.blake2b(f"{relation}:{from_id}:{to_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)
