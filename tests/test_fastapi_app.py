"""``examples/fastapi_app.py`` over ASGI (httpx), on MariaDB (two host names), memcached and Redis.

The app's lifespan opens its `AsyncStore` and closes it; the feed pages by
cursor, likes and unlikes write both sides of the pair, fifty viewers liking
one pin at once leave an exact count, and store errors are HTTP errors.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from store import Store, StoreConfig, StoreError
from tests.conftest import cached_mariadb_config

fastapi_app = pytest.importorskip("examples.fastapi_app", exc_type=ImportError)
httpx = pytest.importorskip("httpx")

LIKES, LIKED_BY = "users_likes_pins", "pin_liked_by_user"


@pytest.fixture
def raw(mariadb_ready: StoreConfig, memcached_pair: list[str], redis_ready: str) -> dict[str, Any]:
    return cached_mariadb_config(memcached_pair, redis_ready)


def test_feed_likes_and_errors_over_http(raw: dict[str, Any]) -> None:
    with Store.from_config(raw) as store:
        board = store.create("board", {"name": "kitchen"}, shard=2)  # MySQL001A
        pins = [store.create("pin", {"i": i}, shard=5) for i in range(7)]  # MySQL002A
        for p in pins:
            store.link("board_has_pins", board, p)
        users = [store.create("user", {"u": i}, shard=i % 8) for i in range(50)]
        gone = store.create("pin", {"gone": True})
        store.delete(gone)
    viewer = users[0]
    app = fastapi_app.create_app(raw)

    async def main() -> Any:
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://app") as client,
        ):
            # The feed, page by page.
            seen: list[str] = []
            cursor = None
            while True:
                params: dict[str, Any] = {"limit": 3} | ({"cursor": cursor} if cursor else {})
                r = await client.get(f"/boards/{board}/pins", params=params)
                assert r.status_code == 200, r.text
                body = r.json()
                assert [p["data"] for p in body["pins"]] == [
                    {"i": i} for i in range(len(seen), len(seen) + len(body["pins"]))
                ]
                seen += [p["id"] for p in body["pins"]]
                cursor = body["next_cursor"]
                if cursor is None:
                    break
            assert seen == [str(p) for p in pins]

            # Like, like again, the viewer's hearts in the feed, unlike.
            head = {"X-User-Id": str(viewer)}
            r = await client.post(f"/pins/{pins[1]}/like", headers=head)
            assert r.json() == {"pin": str(pins[1]), "liked": True, "new": True, "likes": 1}
            r = await client.post(f"/pins/{pins[1]}/like", headers=head)
            assert (r.json()["new"], r.json()["likes"]) == (False, 1)
            r = await client.get(f"/boards/{board}/pins", params={"newest_first": "true"}, headers=head)
            assert [p["liked"] for p in r.json()["pins"]] == [p == pins[1] for p in reversed(pins)]
            r = await client.delete(f"/pins/{pins[1]}/like", headers=head)
            assert r.json() == {"pin": str(pins[1]), "liked": False, "was": True, "likes": 0}

            # Fifty viewers at once, then half of them take it back at once.
            async def like(user: int, method: str) -> int:
                r = await client.request(method, f"/pins/{pins[0]}/like", headers={"X-User-Id": str(user)})
                assert r.status_code == 200, r.text
                return int(r.json()["likes"])

            await asyncio.gather(*(like(u, "POST") for u in users))
            await asyncio.gather(*(like(u, "DELETE") for u in users[::2]))

            # Store errors as HTTP errors, and nothing written by them.
            errors = {
                ("GET", f"/boards/{pins[0]}/pins"): 400,  # a pin's ID where a board's goes
                ("GET", "/boards/-1/pins"): 400,
                ("GET", f"/boards/{board}/pins?cursor=nonsense"): 400,
                ("GET", f"/boards/{board}/pins?limit=0"): 400,
                ("GET", f"/boards/{board + 1000}/pins"): 404,  # no such board
                ("POST", f"/pins/{gone}/like"): 404,
                ("POST", f"/pins/{pins[0]}/like?"): 401,  # no viewer
            }
            for (method, url), status in errors.items():
                h = head if status != 401 else {}
                r = await client.request(method, url, headers=h)
                assert r.status_code == status, (url, r.text)
            return app.state.store

    astore = asyncio.run(main())
    with pytest.raises(StoreError, match="closed"):  # the lifespan closed it
        asyncio.run(astore.get(board))
    with Store.from_config(raw) as store:
        assert store.count(LIKED_BY, pins[0]) == 25
        assert set(store.links(LIKED_BY, pins[0], limit=100)) == set(users[1::2])
        for u in users:
            assert store.has_link(LIKES, u, pins[0]) is (u in users[1::2])
            assert store.count(LIKES, u) == (1 if u in users[1::2] else 0)
        assert store.count(LIKED_BY, pins[1]) == 0
        assert store.count(LIKED_BY, gone) == 0
