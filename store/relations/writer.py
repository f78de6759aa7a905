"""The pair writer: a pair and its inverse written so that both sides always end up agreeing.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from store.backends import Backend
from store.backends.statements import ObjectStatements, counted_with_log
from store.cache.follower import VERSION_MARK
from store.cache.leases import wall_ms
from store.engines import Cursor, transaction_pair
from store.exceptions import NotFound, StoreError
from store.relations.repository import ADD, MOVE, REMOVE, Plan, RelationRepository, Side

__all__ = ["Change", "PairWriter", "State"]


# What the primary side settled on, for the inverse side to copy:
# (present, sequence); the sequence is unused when the pair is absent.
State = tuple[bool, int]
#: Logging ``*_counted`` texts kept (`PairWriter._counted_logged`), one per statement and shard.
_LOGGED_TEXTS = 4096


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

    def __init__(self, repo: RelationRepository) -> None:
        self.repo = repo
        #: Test hook, called at each step of a pair write ("start", "primary written",
        #: "inverse committed"): a test that pauses threads there forces interleavings.
        self.step: Callable[[str], None] | None = None
        #: The invalidation log entries of a side's write (`store.cache.follower`); None: not logged.
        self.log: Callable[[Side], str] | None = None
        self._live_texts: dict[tuple[str, int, str], str] = {}
        self._live_stmts: dict[tuple[str, str, str], ObjectStatements] = {}
        self._logged_sql: dict[str, str] = {}

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

        Where statements can be conditional (`Backend.conditional_writes`),
        or a write and its count are one statement (`Backend.counted_writes`),
        a side's move, insert and counts go in one request. Where one
        connection reaches both sides, both sides' go in that request, the
        inverse's speculatively: if the primary side then needs the slow way
        and the inverse side changed, the transaction is rolled back and the
        write runs a side at a time. Where the backend has gates
        (`Backend.gates`), the COMMIT goes in that request too, behind them
        (`_gated`); elsewhere it is the second request.
        Where the inverse side is a transaction of its own (another host), its
        write, count, log row and COMMIT are one request: three in all.
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
            kind = self.repo.link_in(
                cur, primary, sequence, move=move, insert=primary.guard is not None, seen=c.seen
            )
            if kind is not None:
                new, moved = kind == ADD, kind == MOVE
                self._changed(cur, c, kind, sequence, made)
                return True, sequence
            # (the pair is at this sequence already, or it exists and is not to move, or it is
            # absent and its object is not live: one read says if it is in place, else the slow
            # way says which)
            settled = self._in_place(cur, (primary,), sequence if move else None)
            return (True, settled) if settled is not None else slow_first(cur, c)

        def slow_first(cur: Cursor, c: Change) -> State:
            nonlocal new
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
            insert = new and inverse.guard is not None
            if insert or moved:
                kind = self.repo.link_in(cur, inverse, settled, move=moved, insert=insert, seen=c.seen)
            if kind is None and self._in_place(cur, (inverse,), settled) is None:
                kind = slow_second(cur, state, c)
            if kind is not None:
                self._changed(cur, c, kind, settled, made)

        def slow_second(cur: Cursor, state: State, c: Change) -> str | None:
            assert inverse is not None
            self._check_live(cur, inverse)
            return self.repo.set_in(cur, inverse, state, c.seen)

        def second_alone(cur: Cursor, state: State) -> None:
            # The inverse side in a transaction of its own, where statements can be conditional:
            # its move or insert, count and log row with the COMMIT, in one request.
            assert inverse is not None
            _present, settled = state
            insert = new and inverse.guard is not None
            if not (insert or moved):
                second(cur, state)
                return
            c = Change(inverse)
            plan = self.repo.link_plan(inverse, settled, move=moved, insert=insert)
            [kind] = self._committed(cur, [(c, plan)])
            if kind is None:  # it changed nothing: the slow way, in a new transaction
                kind = slow_second(cur, state, c)
                if kind is not None:
                    self._changed(cur, c, kind, settled, made)
            else:
                self._changed(cur, c, kind, settled, made, logged=True)

        def at_once(cur: Cursor) -> None:
            # Both sides on one connection, where statements can be conditional: both sides'
            # move-or-insert in one request, speculatively, then their log row with the COMMIT.
            nonlocal new, moved
            assert inverse is not None
            assert primary.guard is not None
            assert inverse.guard is not None
            new = moved = False  # (again after a deadlock)
            made.clear()
            self._lock_key(cur, primary)  # (where the backend has a key lock: it goes out first)
            cp, ci = Change(primary), Change(inverse)
            mine = self.repo.link_plan(primary, sequence, move=move, insert=True)
            theirs = self.repo.link_plan(inverse, sequence, move=move, insert=True)
            gated = self._gated(cur, (cp, ci), (mine, theirs), sequence, made)
            if gated:
                new, moved = made[0].kind == ADD, made[0].kind == MOVE
                return
            if gated is None:  # (the primary side changed nothing; the inverse side was not tried)
                kind = other = None
            else:
                results = cur.batch(mine.statements + theirs.statements)
                n = len(mine.statements)
                kind = mine.outcome(results[:n], cp.seen)
                other = theirs.outcome(results[n:], ci.seen)
            if kind is None:
                # The primary side takes the slow way; the inverse side must not have moved first.
                if other is not None:
                    raise _AgainError
                if self._in_place(cur, (primary, inverse), sequence if move else None) is not None:
                    return  # a re-link of a whole pair: nothing to write (the slow way's verdict)
                state = slow_first(cur, cp)
                second(cur, state)
                return
            new, moved = kind == ADD, kind == MOVE
            self._changed(cur, cp, kind, sequence, made)
            if other is None:
                other = slow_second(cur, (True, sequence), ci)
            if other is not None:
                self._changed(cur, ci, other, sequence, made)

        try:
            self._run(primary, inverse, first, second, at_once=at_once, alone=second_alone)
        except _AgainError:  # rolled back: the plain protocol, a side at a time
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

        def second_alone(cur: Cursor, _state: State) -> None:
            # The inverse side in a transaction of its own: its delete, count and log row with
            # the COMMIT, in one request.
            assert inverse is not None
            c = Change(inverse)
            if self._committed(cur, [(c, self.repo.unlink_plan(inverse))]) != [None]:
                self._changed(cur, c, REMOVE, 0, made, logged=True)

        def at_once(cur: Cursor) -> None:
            # Both sides on one connection: both deletes, their counts (and log rows) and the
            # COMMIT in one request. Nothing waits on what they did: each side's delete is right
            # whatever the other found (a torn pair loses its half too).
            nonlocal gone
            assert inverse is not None
            gone = False  # (again after a deadlock)
            made.clear()
            self._lock_key(cur, primary)
            cs = [Change(primary), Change(inverse)]
            kinds = self._committed(cur, [(c, self.repo.unlink_plan(c.side)) for c in cs])
            for c, kind in zip(cs, kinds, strict=True):
                if kind is not None:
                    gone = gone or c.side is primary
                    self._changed(cur, c, REMOVE, 0, made, logged=True)

        self._run(primary, inverse, first, second, at_once=at_once, alone=second_alone)
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
        *,
        at_once: Callable[[Cursor], None] | None = None,
        alone: Callable[[Cursor, State], None] | None = None,
    ) -> None:
        """``first`` on the primary side, then ``second`` on the inverse side, as the protocol says.

        Where statements can be conditional (`Backend.conditional_writes`, `Backend.counted_writes`):
        ``at_once``, if given, writes both where one connection reaches both sides (after the
        primary's key lock, where the backend has one); ``alone``, if given, takes
        ``second``'s place where the inverse side is a transaction of its own (it may commit that
        transaction itself). Elsewhere both are ignored.
        """
        b = primary.h.backend
        if not (b.conditional_writes or b.counted_writes):
            at_once = alone = None
        step = self.step or _no_step
        step("start")
        p, i = primary.h, None if inverse is None else inverse.h
        if i is None:
            p.transaction(first)
            return
        if p.pool is i.pool and at_once is not None:
            p.transaction(at_once)
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
        transaction_pair(p, i, first, alone or second, step=step)

    def _gated(
        self,
        cur: Cursor,
        changes: tuple[Change, Change],
        plans: tuple[Plan, Plan],
        sequence: int,
        made: list[Change],
    ) -> bool | None:
        """Both sides' writes and the COMMIT in one request, behind gates (`Backend.gates`): the
        COMMIT runs only if each side's write changed its row, the usual case (a new pair, or
        a pair moved).

        True if it ran (both changes noted in ``made``). None if the primary side's gate ended
        the request and the transaction goes on (`Backend.gate` 0, MariaDB): its write changed
        nothing, the inverse side's statements did not run (a pair in place, a deleted object:
        the slow ways decide). False if a gate ended it and the transaction cannot go on (the
        inverse side's on MariaDB: a torn pair, a deleted object; either on PostgreSQL, whose
        transaction is then in error): it is begun again, as if nothing had been sent. False
        too, and nothing sent, where the backend has no gates, or a host logs its writes and
        the backend's writes cannot log themselves (MariaDB: the log row goes with the COMMIT).
        Where they can (PostgreSQL: `Backend.counted_writes`), each side's write logs its own
        list if it changed its row, as `_committed` has it, and the gates go after.
        """
        if not self.gates([c.side for c in changes], logs=True):
            return False
        h = changes[0].side.h
        backend = h.backend
        log = None if self.log is None or h.log_sql() is None else self.log  # (one host: both sides')
        statements: list[tuple[str, Any]] = []
        places: list[list[int]] = []
        for n, (c, plan) in enumerate(zip(changes, plans, strict=True)):
            own = plan.statements
            if log is not None:
                entry, at_ms = log(c.side), wall_ms()
                own = [(self._counted_logged(backend, text), (*v, at_ms, entry)) for text, v in own]
            gated, mine = backend.gate_plan(own, len(plan.kinds), n)
            places.append([len(statements) + k for k in mine])
            statements += gated
        try:
            results = cur.commit_with(statements)
        except Exception as exc:
            which = backend.gate(exc)
            if which is None:
                raise
            if which == 0:
                return None
            cur.again()  # (the ROLLBACK and a new BEGIN go out with the next request)
            self._lock_key(cur, changes[0].side)  # (rolled back with the rest)
            return False
        for c, plan, at in zip(changes, plans, places, strict=True):
            kind = plan.outcome([results[k] for k in at], c.seen)
            assert kind is not None  # (its gate let the COMMIT run)
            self._changed(cur, c, kind, sequence, made, logged=log is not None)
        return True

    def gates(self, sides: Sequence[Side], *, logs: bool = False) -> bool:
        """Whether writes of ``sides`` (on one host) may send their COMMIT with them, behind gates:
        the backend has gates (`Backend.gates`), and no host of theirs logs its writes (the log
        row goes with the COMMIT, in a request of its own). ``logs``: the caller's statements
        log their own lists (`_gated`), which a backend whose writes count themselves allows
        (`Backend.counted_writes`): hosts that log may take gates then too."""
        backend = sides[0].h.backend
        if not backend.gates:
            return False
        if self.log is None or not any(s.h.log_sql() for s in sides):
            return True
        return logs and backend.counted_writes

    def _committed(self, cur: Cursor, writes: Sequence[tuple[Change, Plan]]) -> list[str | None]:
        """Run each of ``writes`` (a `Plan` of one write on its ``Change``'s side) with its log row
        (where the host logs: written only if the write changed the row), then COMMIT, all in one
        request; the kind of change each made, or None."""
        statements: list[tuple[str, Sequence[Any]]] = []
        spans: list[tuple[int, int]] = []
        for c, plan in writes:
            h = c.side.h
            own = list(plan.statements)
            sql = None if self.log is None else h.log_sql()
            if sql is not None and h.backend.counted_writes:
                # Each write logs its list in its own statement, if it changed a row (at most one does).
                assert self.log is not None
                entry = self.log(c.side)
                own = [(self._counted_logged(h.backend, text), (*v, wall_ms(), entry)) for text, v in own]
            elif sql is not None:
                assert self.log is not None
                logged = h.backend.change_log_insert_if_changed()
                own.append((logged, (wall_ms(), self.log(c.side) + VERSION_MARK)))
            spans.append((len(statements), len(plan.statements)))
            statements += own
        results = cur.commit_with(statements)
        return [
            plan.outcome(results[start : start + n], c.seen)
            for (c, plan), (start, n) in zip(writes, spans, strict=True)
        ]

    def _changed(
        self, cur: Cursor, c: Change, kind: str, sequence: int, made: list[Change], *, logged: bool = False
    ) -> None:
        """Note how ``c``'s side changed, and log its list for the followers (where the host logs;
        ``logged``: it is logged already, by `_committed`).

        The list goes in the transaction's one log row, with its COMMIT;
        where the backend keeps list versions, with the version the
        transaction leaves the list at: the one its statement returned if
        that is in already (the row's lock is held to the COMMIT), else read
        in the log row's statement (`Backend.change_log_insert_versions`).
        """
        c.kind, c.sequence = kind, sequence
        made.append(c)
        if self.log is None or logged:
            return
        h = c.side.h
        sql = h.log_sql()
        if sql is None:
            return
        if c.version:  # known already (its statement's result is in): the entry as it is
            cur.defer_log(sql, wall_ms(), f"{self.log(c.side)}{VERSION_MARK}{c.version}")
        elif h.backend.list_versions:
            version = self.repo.sql(h, c.side.relation).version_of
            entry = self.log(c.side) + VERSION_MARK
            cur.defer_log_version(sql, wall_ms(), entry, version, (c.side.relation, c.side.from_id))
        else:
            cur.defer_log(sql, wall_ms(), self.log(c.side))

    def _counted_logged(self, backend: Backend, text: str) -> str:
        """A ``*_counted`` statement's ``text`` that also writes a log row (at_ms, entries) if it
        changed a row (`store.backends.statements.counted_with_log`); made once per text."""
        out = self._logged_sql.get(text)
        if out is None:
            if len(self._logged_sql) >= _LOGGED_TEXTS:
                self._logged_sql.clear()
            log = backend.change_log
            assert log is not None  # (a host that logs has one)
            out = self._logged_sql[text] = counted_with_log(text, log)
        return out

    # -- locks and checks -------------------------------------------------------------

    def lock_keys(self, cur: Cursor, sides: Sequence[Side]) -> None:
        """`_lock_key` of each of ``sides`` (one shard's backend), in their order: one statement
        where the backend locks many keys at once (`Backend.key_locks`)."""
        if not sides:
            return
        many = sides[0].h.backend.key_locks
        if many is not None and len(sides) > 1:
            keys = ",".join([str(_key_hash(s.relation, s.from_id, s.to_id)) for s in sides])
            cur.defer(many, ("{" + keys + "}",))
            return
        for side in sides:
            self._lock_key(cur, side)

    def _lock_key(self, cur: Cursor, side: Side) -> None:
        lock = side.h.backend.key_lock
        if lock is not None:
            # Its row is not read: where the driver pipelines, it goes out with the write it guards.
            cur.defer(lock, (_key_hash(side.relation, side.from_id, side.to_id),))

    def _live_sql(self, side: Side) -> str:
        """The read of ``side``'s guard object in share mode: its ``active`` (no row if it has none)."""
        g = side.guard
        assert g is not None
        h = side.h
        key = (h.backend.name, h.shard, g.table)
        sql = self._live_texts.get(key)
        if sql is None:
            kind = (h.backend.name, g.table, g.key)
            stmts = self._live_stmts.get(kind)
            if stmts is None:  # compiled once per backend, not per shard
                ids = "instagram" if g.key == "id" else "pinterest"
                stmts = self._live_stmts[kind] = ObjectStatements(h.backend, g.table, ids=ids)
            sql = self._live_texts[key] = stmts.for_shard(h.shard)["live_shared"]
        return sql

    def _in_place(self, cur: Cursor, sides: Sequence[Side], sequence: int | None) -> int | None:
        """The sequence the pair is at on every one of ``sides``, if it is there on each at one
        sequence (``sequence``, if given) and no side's object is deleted; else None. One
        request, read under the locks the slow way takes (each row's key, each object in share
        mode). A sequence: the slow way would change nothing there. None: it must run (it
        changes something, or refuses the link)."""
        reads: list[tuple[str, Sequence[Any]]] = []
        guarded: list[int] = []  # the index of each object's read
        for side in sides:
            g = side.guard
            if g is not None:
                guarded.append(len(reads))
                reads.append((self._live_sql(side), (g.value,)))
            reads.append((self.repo.sql(side.h, side.relation).exists_locked, (side.from_id, side.to_id)))
        answers = [rows for _n, rows in cur.batch_rows(reads)]
        if any(answers[k] and not answers[k][0][0] for k in guarded):
            return None  # an object deleted: the slow way refuses the link
        seqs = {int(rows[0][0]) if rows else None for k, rows in enumerate(answers) if k not in guarded}
        if len(seqs) != 1 or None in seqs or sequence not in (None, *seqs):
            return None
        return seqs.pop()

    def _check_live(self, cur: Cursor, side: Side) -> None:
        g = side.guard
        if g is None:
            return
        cur.execute(self._live_sql(side), (g.value,))
        row = cur.fetchone()
        if row is not None and not row[0]:
            raise NotFound(f"{g.what} was deleted: a deleted object cannot be linked")


class _AgainError(StoreError):
    """A speculative write of both sides went wrong way round: rolled back, to be run side by side."""


def _no_step(_name: str) -> None:
    return None


def _key_hash(relation: str, from_id: int, to_id: int) -> int:
    """A signed 64-bit key for the pair (a collision only makes two pairs wait for each other)."""
    digest = hashlib.blake2b(f"{relation}:{from_id}:{to_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)
