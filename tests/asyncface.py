"""The async face seen through the sync API, so one behavioural test runs against both faces.

`Blocking` wraps a `store.aio.AsyncStore`: each coroutine method becomes a
blocking call that runs the coroutine on an event loop in a background
thread and waits for it (from any thread, as the sync store is called); other
attributes (``config``, ``shard_map``, ``admin_context``) are the async
store's own. Exceptions come through as they were raised.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import threading
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar, cast

from store import Store, StoreConfig
from store.aio import AsyncStore

T = TypeVar("T")


class LoopThread:
    """An event loop running in a thread of its own until `close`."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result. Its task runs in a copy of the calling
        thread's context (as `asyncio.to_thread` carries it the other way), so a context variable
        a test sets reaches the store's worker (`AsyncStore` carries it into its executor)."""
        context = contextvars.copy_context()
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def start() -> None:
            task = self.loop.create_task(coro, context=context)

            def finished(t: asyncio.Task[T]) -> None:
                if t.cancelled():
                    done.cancel()
                elif (exc := t.exception()) is not None:
                    done.set_exception(exc)
                else:
                    done.set_result(t.result())

            task.add_done_callback(finished)

        self.loop.call_soon_threadsafe(start)
        return done.result()

    def close(self) -> None:
        """Stop the loop, join its thread and close it."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()


class Blocking:
    """An `AsyncStore` with the sync `Store` API (each coroutine run on a `LoopThread`)."""

    def __init__(self, astore: AsyncStore, loop: LoopThread) -> None:
        self.astore = astore
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.astore, name)
        if inspect.iscoroutinefunction(attr):
            fn = cast(Callable[..., Coroutine[Any, Any, Any]], attr)
            return lambda *args, **kwargs: self._loop.run(fn(*args, **kwargs))
        return attr

    def close(self) -> None:
        """`AsyncStore.aclose`, then the loop's end."""
        try:
            self._loop.run(self.astore.aclose())
        finally:
            self._loop.close()

    def __enter__(self) -> Blocking:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


#: The faces a behavioural test can run through: the sync `Store`, and `AsyncStore` with each of
#: its ways of running calls (``async``: worker threads; ``native``: greenlets on the loop).
FACES = {"async": "threads", "native": "native"}


def blocking_store(config: StoreConfig, face: str) -> Store:
    """A store on ``config`` with the sync API: the `Store` itself, or (``face`` "async" or
    "native") an `AsyncStore` behind `Blocking`. Close it (or use ``with``) as a store."""
    if face == "sync":
        return Store(config)
    loop = LoopThread()
    return cast(Store, Blocking(AsyncStore(config, io=FACES[face]), loop))
