"""The operator page: server-rendered HTML on Starlette, refreshed by a few lines of inline script.

``/`` is the whole page; ``/panels`` is its panels alone, which the page
fetches every second and swaps in (no build step, no front-end framework;
without script, a meta refresh reloads the page). Every panel has a JSON
endpoint: ``/api/map``, ``/api/hosts``, ``/api/caches``, ``/api/move``,
``/api/check`` (and ``/api/all``); ``/metrics`` with ``--metrics``. With a
token, every request needs it (``Authorization: Bearer TOKEN``,
``X-Store-Token: TOKEN`` or ``?token=TOKEN``).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from html import escape
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from store.serve.panels import Panels

__all__ = ["build_app", "render_page", "render_panels"]

_STYLE = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.3em;margin:0 0 .6em} h2{font-size:1.05em;margin:1.2em 0 .4em}
section{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.8em 1em;margin-bottom:1em}
.map{display:flex;height:42px;border:1px solid #999;border-radius:4px;overflow:hidden}
.bar{color:#fff;font-size:12px;display:flex;align-items:center;justify-content:center;
 border-right:1px solid #fff;white-space:nowrap;overflow:hidden}
table{border-collapse:collapse} td,th{padding:.2em .8em;text-align:left;border-bottom:1px solid #eee}
.swatch{display:inline-block;width:.9em;height:.9em;border-radius:2px;vertical-align:middle}
.ok{color:#2a7d2a}.bad{color:#b22}.muted{color:#777}
progress{width:24em;height:1.2em}
"""

_SCRIPT = """
(function(){
  var q = window.location.search;
  function tick(){
    fetch('panels' + q, {cache: 'no-store'}).then(function(r){ return r.ok ? r.text() : null; })
      .then(function(html){ if (html !== null) { document.getElementById('panels').innerHTML = html; } })
      .catch(function(){});
  }
  setInterval(tick, 1000);
})();
"""


def _when(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:,}"


def _size(v: Any) -> str:
    if v is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if v < 1024 or unit == "GB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return "-"


def _map_panel(m: dict[str, Any]) -> str:
    bars = []
    for r in m["ranges"]:
        width = 100.0 * r["shards"] / max(1, m["shards"])
        label = f"{r['master']} {r['start']}-{r['end']}"
        bars.append(
            f'<div class="bar" data-host="{escape(r["master"])}" data-range="{r["start"]}-{r["end"]}" '
            f'style="width:{width:.4f}%;background:{r["colour"]}" title="{escape(label)}">'
            f"{escape(label)}</div>"
        )
    return (
        '<section id="map-panel"><h2>Shard map</h2>'
        f'<p>version <b id="map-version">{m["version"]}</b>, {m["shards"]} shards, '
        f"{len(m['ranges'])} range(s); changed {_when(m['changed_at'])}; {_map_age(m)}</p>"
        f"{_map_error(m)}"
        f'<div class="map" id="map">{"".join(bars)}</div></section>'
    )


def _map_age(m: dict[str, Any]) -> str:
    age = m.get("age_s")
    if age is None:
        return '<span id="map-age" class="muted">the config\'s map (no map source)</span>'
    return (
        f'<span id="map-age" data-age="{age:.3f}" class="{"bad" if m.get("source_error") else "ok"}">'
        f"confirmed by its {escape(str(m.get('source')))} source {age:.1f} s ago</span>"
    )


def _map_error(m: dict[str, Any]) -> str:
    error = m.get("source_error")
    if not error:
        return ""
    return (
        f'<p id="map-source-error" class="bad">the map source cannot be read, the last map stays: '
        f"{escape(str(error))}</p>"
    )


def _replication_text(reps: list[dict[str, Any]]) -> str:
    if not reps:
        return '<span class="muted">none</span>'
    parts = []
    for r in reps:
        good = r["io"] == "Yes" and r["sql"] == "Yes"
        lag = "-" if r["lag_s"] is None else f"{r['lag_s']} s"
        name = escape(r["name"] or "default")
        parts.append(
            f'<span class="{"ok" if good else "bad"}">{name} from {escape(r["master"])}: '
            f"IO {escape(str(r['io']))}, SQL {escape(str(r['sql']))}, lag {lag}</span>"
        )
    return "<br>".join(parts)


def _hosts_panel(hosts: list[dict[str, Any]]) -> str:
    rows = []
    for h in hosts:
        slaves = "; ".join(
            f"{escape(s['slave'])}: {_replication_text(s['replication'])}" for s in h.get("slave_state", [])
        )
        ping = "-" if h["ping_ms"] is None else f"{h['ping_ms']:.2f} ms"
        err = f'<br><span class="bad">{escape(h["error"])}</span>' if h["error"] else ""
        rows.append(
            f'<tr class="host" data-host="{escape(h["host"])}"><td><span class="swatch" '
            f'style="background:{h["colour"]}"></span> <b>{escape(h["host"])}</b><br>'
            f'<span class="muted">{escape(h["url"])}</span>{err}</td>'
            f'<td class="shards">{h["shards"]}</td><td>{_num(h["rows"])}</td><td>{_size(h["bytes"])}</td>'
            f"<td>{ping}</td><td>{slaves or '<span class=muted>no slave</span>'}</td>"
            f"<td>{_replication_text(h['replication'])}</td></tr>"
        )
    return (
        '<section id="hosts-panel"><h2>Hosts</h2><table><tr><th>host</th><th>shards</th><th>rows</th>'
        "<th>bytes</th><th>ping</th><th>its slave</th><th>replicating here</th></tr>"
        f"{''.join(rows)}</table></section>"
    )


def _caches_panel(caches: list[dict[str, Any]]) -> str:
    if not caches:
        return '<section id="caches-panel"><h2>Caches</h2><p class="muted">no cache servers</p></section>'
    rows = []
    for c in caches:
        ratio = "-" if c["hit_ratio"] is None else f"{100 * c['hit_ratio']:.1f} %"
        up = '<span class="ok">up</span>' if c.get("up") else '<span class="bad">down</span>'
        br = c["breaker"]
        rows.append(
            f'<tr class="cache"><td>{escape(c["kind"])}</td><td>{escape(c["server"])}</td><td>{up}</td>'
            f"<td>{_num(c['hits'])}</td><td>{_num(c['misses'])}</td><td>{ratio}</td>"
            f'<td class="{"bad" if br == "open" else "ok"}">{br}</td></tr>'
        )
    return (
        '<section id="caches-panel"><h2>Caches</h2><table><tr><th>cache</th><th>server</th><th>state</th>'
        "<th>hits</th><th>misses</th><th>hit ratio</th><th>breaker</th></tr>"
        f"{''.join(rows)}</table></section>"
    )


def _invalidators_panel(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return (
            '<section id="invalidators-panel"><h2>Invalidators</h2><p class="muted">no '
            "invalidation daemon configured (cache.invalidation: window)</p></section>"
        )
    out = []
    for r in rows:
        lead, standby = r.get("leader"), r.get("standby")
        if lead is None:
            leader = '<span class="bad">none</span>'
            position = lag = deleted = "-"
        else:
            leader = f'<span class="ok">{escape(str(lead.get("instance", "?")))}</span>'
            position = escape(str(lead.get("position") or "-"))
            lag = "-" if lead.get("lag_s") is None else f"{float(lead['lag_s']):.2f} s"
            deleted = _num(lead.get("keys_deleted"))
        waiting = "none" if standby is None else escape(str(standby.get("instance", "?")))
        ages = "; ".join(
            f"{escape(h)}: " + ("none" if a is None else f"{float(a):.2f} s")
            for h, a in r["heartbeat_age_s"].items()
        )
        cls = "bad" if r["stale"] else "ok"
        out.append(
            f'<tr class="invalidator"><td>{escape(r["server"])}<br><span class="muted">'
            f"{escape(', '.join(r['hosts']))} ({escape(r['mode'])})</span></td><td>{leader}</td>"
            f'<td>{waiting}</td><td>{position}</td><td>{lag}</td><td class="{cls}">{ages}</td>'
            f"<td>{deleted}</td></tr>"
        )
    return (
        '<section id="invalidators-panel"><h2>Invalidators</h2><table><tr><th>server</th><th>leader</th>'
        "<th>standby</th><th>position</th><th>lag</th><th>heartbeat age</th><th>keys deleted</th></tr>"
        f"{''.join(out)}</table></section>"
    )


def _move_panel(mv: dict[str, Any]) -> str:
    if not mv.get("present"):
        return '<section id="move-panel"><h2>Move</h2><p class="muted">no move journaled</p></section>'
    pct = 100.0 * float(mv.get("progress") or 0.0)
    running = bool(mv.get("running")) and mv.get("phase") not in ("done", "aborted")
    lag = mv.get("lag_s")
    fenced = mv.get("fenced_s")
    fence = (
        "-" if fenced is None else f"{fenced:.1f} s{' (fenced now)' if mv.get('fence_ended') is None else ''}"
    )
    rows_total = mv.get("rows_total") or 0
    err = f'<p class="bad">{escape(str(mv["error"]))}</p>' if mv.get("error") else ""
    return (
        '<section id="move-panel"><h2>Move</h2>'
        f"<p>shards {mv.get('low')}-{mv.get('high')} from <b>{escape(str(mv.get('source')))}</b> to "
        f'<b>{escape(str(mv.get("target")))}</b>: phase <b id="move-phase">{escape(str(mv.get("phase")))}'
        f"</b> ({escape(str(mv.get('step', '')))}){' running' if running else ''}</p>"
        f'<p><progress id="move-bar" max="100" value="{pct:.1f}"></progress> '
        f'<span id="move-progress" data-progress="{pct:.1f}">{pct:.1f} %</span></p>'
        f"<p>rows copied {_num(mv.get('rows_copied'))} of about {_num(rows_total)}; "
        f"dump {_size(mv.get('bytes_copied'))}; replication lag "
        f'<span id="move-lag">{"-" if lag is None else f"{lag:.0f} s"}</span>; '
        f'fence <span id="move-fence">{fence}</span>; updated {_when(mv.get("updated"))}</p>{err}</section>'
    )


def _check_panel(ck: dict[str, Any]) -> str:
    if not ck.get("present"):
        hint = "run <code>store check --result-file FILE</code> and serve with <code>--check-file FILE</code>"
        return (
            f'<section id="check-panel"><h2>Last check</h2><p class="muted">no result kept: {hint}</p>'
            "</section>"
        )
    state = (
        '<b class="ok">ok</b>'
        if ck.get("ok")
        else f'<b class="bad">{len(ck.get("problems", []))} problem(s)</b>'
    )
    items = "".join(
        f"<li>{escape(str(p.get('kind')))}: {escape(str(p.get('detail')))}</li>"
        for p in ck.get("problems", [])[:20]
    )
    return (
        f'<section id="check-panel"><h2>Last check</h2><p id="check-state">{state} at map version '
        f"{ck.get('map_version')}, {_when(ck.get('checked_at'))}: {ck.get('live_exactly_once')} of "
        f"{ck.get('shards')} shards live exactly once</p><ul>{items}</ul></section>"
    )


def render_panels(panels: Panels) -> str:
    """Every panel's HTML, read now."""
    return "".join(
        (
            _map_panel(panels.map()),
            _move_panel(panels.move()),
            _hosts_panel(panels.hosts()),
            _caches_panel(panels.caches()),
            _invalidators_panel(panels.invalidators()),
            _check_panel(panels.check()),
        )
    )


def render_page(panels: Panels) -> str:
    """The whole page: panels, style and the refresh script."""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>store</title>'
        '<noscript><meta http-equiv="refresh" content="2"></noscript>'
        f"<style>{_STYLE}</style></head><body><h1>store: live map, hosts, caches, moves</h1>"
        f'<div id="panels">{render_panels(panels)}</div>'
        '<p class="muted">JSON: <a href="api/map">/api/map</a> <a href="api/hosts">/api/hosts</a> '
        '<a href="api/caches">/api/caches</a> <a href="api/move">/api/move</a> '
        '<a href="api/check">/api/check</a></p>'
        f"<script>{_SCRIPT}</script></body></html>"
    )


def build_app(
    panels: Panels, *, token: str | None = None, metrics: Callable[[], bytes] | None = None
) -> Starlette:
    """The Starlette app of the page over ``panels``; ``metrics`` renders ``/metrics`` (None: no route)."""

    def allowed(request: Request) -> bool:
        if not token:
            return True
        given = request.query_params.get("token") or request.headers.get("x-store-token") or ""
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        return hmac.compare_digest(given.encode(), token.encode())

    def guarded(fn: Callable[[Request], Response]) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:
            if not allowed(request):
                return PlainTextResponse(
                    "a token is needed: ?token=, X-Store-Token or Bearer", status_code=401
                )
            return fn(request)

        return endpoint

    def api(read: Callable[[], Any]) -> Callable[[Request], Response]:
        return guarded(lambda _r: JSONResponse(read()))

    def everything() -> dict[str, Any]:
        return {
            "map": panels.map(),
            "hosts": panels.hosts(),
            "caches": panels.caches(),
            "invalidators": panels.invalidators(),
            "move": panels.move(),
            "check": panels.check(),
        }

    routes = [
        Route("/", guarded(lambda _r: HTMLResponse(render_page(panels)))),
        Route("/panels", guarded(lambda _r: HTMLResponse(render_panels(panels)))),
        Route("/api/map", api(panels.map)),
        Route("/api/hosts", api(panels.hosts)),
        Route("/api/caches", api(panels.caches)),
        Route("/api/invalidators", api(panels.invalidators)),
        Route("/api/move", api(panels.move)),
        Route("/api/check", api(panels.check)),
        Route("/api/all", api(everything)),
    ]
    if metrics is not None:
        render = metrics
        routes.append(
            Route(
                "/metrics",
                guarded(lambda _r: Response(render(), media_type="text/plain; version=0.0.4; charset=utf-8")),
            )
        )
    return Starlette(routes=routes)
