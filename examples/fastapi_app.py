"""A FastAPI app on `store.aio.AsyncStore`: a board's pin feed, and liking pins.

Run it (``pip install 'shardstore[fastapi]' uvicorn``)::

    STORE_CONFIG=config/local.yaml uvicorn examples.fastapi_app:app

(without ``STORE_CONFIG``, the embedded default: SQLite files and in-process
caches). The store is opened when the app starts and closed when it stops
(the lifespan), one per process; every endpoint awaits it, so no endpoint
blocks the event loop. The viewer is the ``X-User-Id`` header, where an
app's authentication would put it.

- ``GET /boards/{board_id}/pins?cursor=&limit=&newest_first=``: one page of
  the board's pins with the pin objects, whether the viewer liked each
  (when there is a viewer), and the next page's cursor.
- ``POST /pins/{pin_id}/like`` and ``DELETE /pins/{pin_id}/like``: the
  viewer likes or stops liking the pin (both sides: ``users_likes_pins``
  and ``pin_liked_by_user``); the answer has the pin's like count.

Store errors become HTTP errors: a malformed ID, cursor or limit is 400, an
ID of another type or of no live object 404, a database that failed 503.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse

from store import (
    BackendError,
    CursorError,
    IdError,
    LimitError,
    NotFound,
    RoutingError,
    StoreConfig,
    StoreError,
    UnknownTypeError,
)
from store.aio import AsyncStore

LIKES = "users_likes_pins"
LIKED_BY = "pin_liked_by_user"

#: HTTP status of each store error (the first class that matches); any other is 500.
STATUS: tuple[tuple[type[StoreError], int], ...] = (
    (IdError, 400),  # its subclass WrongTypeError: an ID of another type names nothing here
    (CursorError, 400),
    (LimitError, 400),
    (NotFound, 404),
    (UnknownTypeError, 404),
    (RoutingError, 404),
    (BackendError, 503),
)


def store_of(request: Request) -> AsyncStore:
    """The app's store, opened by its lifespan."""
    store: AsyncStore = request.app.state.store
    return store


def viewer_of(x_user_id: Annotated[int | None, Header()] = None) -> int | None:
    """The viewer's user ID, if the request names one."""
    return x_user_id


def required_viewer(viewer: Annotated[int | None, Depends(viewer_of)]) -> int:
    """The viewer's user ID; 401 without one."""
    if viewer is None:
        raise HTTPException(401, "send the viewer's user ID in X-User-Id")
    return viewer


StoreDep = Annotated[AsyncStore, Depends(store_of)]
Viewer = Annotated[int | None, Depends(viewer_of)]
RequiredViewer = Annotated[int, Depends(required_viewer)]


def create_app(source: str | os.PathLike[str] | Mapping[str, Any] | StoreConfig | None = None) -> FastAPI:
    """The app, on a store made from ``source`` (what `Store.from_config` takes) when it starts."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncStore.from_config(source) as store:
            app.state.store = store
            yield
        # Leaving the block waited for every call still running, then closed the connections.

    app = FastAPI(title="pins", lifespan=lifespan)

    @app.exception_handler(StoreError)
    async def store_error(_request: Request, exc: StoreError) -> JSONResponse:
        status = next((code for cls, code in STATUS if isinstance(exc, cls)), 500)
        return JSONResponse({"error": type(exc).__name__, "detail": str(exc)}, status_code=status)

    @app.get("/boards/{board_id}/pins")
    async def board_pins(
        board_id: int,
        store: StoreDep,
        viewer: Viewer,
        cursor: str | None = None,
        limit: int = 50,
        newest_first: bool = False,
    ) -> dict[str, Any]:
        """One page of the board's pins, with the objects, the viewer's likes and the next cursor."""
        if cursor is None and await store.get(board_id, type_name="board") is None:
            raise NotFound(f"no live board {board_id}")
        page = await store.board_pins(board_id, limit=limit, cursor=cursor, newest_first=newest_first)
        liked = await store.has_links(LIKES, viewer, page.ids) if viewer is not None else set()
        pins = [
            {"id": str(pin), "data": data, "liked": pin in liked}
            for pin, data in zip(page.ids, page.objects or [], strict=True)
        ]
        return {"board": str(board_id), "pins": pins, "next_cursor": page.next_cursor}

    @app.post("/pins/{pin_id}/like")
    async def like(pin_id: int, store: StoreDep, viewer: RequiredViewer) -> dict[str, Any]:
        """The viewer likes the pin (again is harmless); the pin's like count after it."""
        new = await store.link(LIKES, viewer, pin_id)  # NotFound if the pin or the user is gone
        return {"pin": str(pin_id), "liked": True, "new": new, "likes": await store.count(LIKED_BY, pin_id)}

    @app.delete("/pins/{pin_id}/like")
    async def unlike(pin_id: int, store: StoreDep, viewer: RequiredViewer) -> dict[str, Any]:
        """The viewer stops liking the pin; the pin's like count after it."""
        was = await store.unlink(LIKES, viewer, pin_id)
        return {"pin": str(pin_id), "liked": False, "was": was, "likes": await store.count(LIKED_BY, pin_id)}

    return app


#: For ``uvicorn examples.fastapi_app:app``: the config in ``$STORE_CONFIG``, else the embedded default.
app = create_app(os.environ.get("STORE_CONFIG") or None)
