"""A small Label Studio stand-in served for real on 127.0.0.1 (a test peer, not a mock of our code).

It speaks the few endpoints the service calls, with Label Studio's shapes and status codes: token auth
(``Authorization: Token <token>``; 401 otherwise), ``GET``/``PATCH /api/projects/{id}/``, ``POST
/api/projects/{id}/import?return_task_ids=true`` (400 when a task lacks a field the labeling config
shows, as Label Studio does), ``GET /api/tasks/?project=&page=&page_size=&fields=all`` (404 past the last
page), ``GET /api/tasks/{id}/annotations/``, ``GET /api/annotations/{id}/`` and the Data Manager views
(``GET/POST /api/dm/views/``, ``PUT /api/dm/views/{id}/``). Tests annotate tasks with
:meth:`FakeLabelStudio.annotate` and add user-imported tasks with :meth:`FakeLabelStudio.add_task`.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

TEXT_CONFIG = """<View>
  <Text name="text" value="$text"/>
  <Choices name="label" toName="text" choice="single">
    <Choice value="ant"/><Choice value="bee"/><Choice value="cat"/>
  </Choices>
</View>"""


class FakeLabelStudio:
    def __init__(self, token: str = "good-token", label_config: str = TEXT_CONFIG, project_id: int = 7) -> None:
        self.token = token
        self.projects: dict[int, dict[str, Any]] = {project_id: {"id": project_id, "label_config": label_config}}
        self.tasks: dict[int, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.views: dict[int, dict[str, Any]] = {}
        self._next_view = 1
        self.fail_with: int | None = None  # answer every request with this status
        self._next_task = 1
        self._next_annotation = 1
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> FakeLabelStudio:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------------ test helpers

    def annotate(self, task_id: int, choice: str | None = None, *, result: list[dict[str, Any]] | None = None) -> dict:
        with self._lock:
            now = datetime.now(UTC).isoformat()
            annotation = {
                "id": self._next_annotation,
                "task": task_id,
                "result": result
                if result is not None
                else [{"from_name": "label", "to_name": "text", "type": "choices", "value": {"choices": [choice]}}],
                "was_cancelled": False,
                "completed_by": 1,
                "created_at": now,
                "updated_at": now,
            }
            self._next_annotation += 1
            self.tasks[task_id]["annotations"].append(annotation)
            return annotation

    def add_task(self, data: dict[str, Any], project_id: int = 7) -> dict[str, Any]:
        """A task the user imported themselves (not through the service)."""
        with self._lock:
            tid = self._next_task
            self._next_task += 1
            self.tasks[tid] = {"id": tid, "project": project_id, "data": data, "predictions": [], "annotations": []}
            return self.tasks[tid]

    def view_tasks(self, view_id: int) -> list[dict[str, Any]]:
        """Tasks a Data Manager view lists (its filters: equal on task data or total_annotations; its
        ordering on one task data field), as Label Studio applies them."""
        data = self.views[view_id]["data"]
        rows = list(self.tasks.values())
        for f in data.get("filters", {}).get("items", []):
            column = f["filter"].removeprefix("filter:tasks:")
            if column.startswith("data."):
                rows = [t for t in rows if t["data"].get(column[5:]) == f["value"]]
            elif column == "total_annotations":
                rows = [t for t in rows if len(t["annotations"]) == f["value"]]
        for key in reversed(data.get("ordering", [])):
            field = key.lstrip("-").removeprefix("tasks:data.")
            rows.sort(key=lambda t: t["data"].get(field), reverse=key.startswith("-"))
        return rows

    def delete_annotations(self, task_id: int) -> None:
        with self._lock:
            self.tasks[task_id]["annotations"] = []

    def task_for_item(self, item_id: str, field: str = "item_id") -> dict[str, Any]:
        return next(t for t in self.tasks.values() if t["data"].get(field) == item_id)

    # ------------------------------------------------------------------ HTTP

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self, method: str) -> None:
                url = urlsplit(self.path)
                fake.requests.append((method, self.path))
                if fake.fail_with is not None:
                    return self._send(fake.fail_with, {"detail": "injected failure"})
                if self.headers.get("Authorization") != f"Token {fake.token}":
                    return self._send(401, {"detail": "Invalid token."})
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                if (m := re.fullmatch(r"/api/projects/(\d+)/", url.path)) and method == "PATCH":
                    project = fake.projects.get(int(m[1]))
                    if project is None:
                        return self._send(404, {"detail": "Not found."})
                    project.update(body or {})
                    return self._send(200, project)
                if m := re.fullmatch(r"/api/projects/(\d+)/", url.path):
                    project = fake.projects.get(int(m[1]))
                    return self._send(200, project) if project else self._send(404, {"detail": "Not found."})
                if (m := re.fullmatch(r"/api/projects/(\d+)/import", url.path)) and method == "POST":
                    project = fake.projects.get(int(m[1]))
                    if project is None:
                        return self._send(404, {"detail": "Not found."})
                    shown = re.findall(r'value="\$(\w+)"', project["label_config"])
                    for task in body:
                        missing = [f for f in shown if f not in task["data"]]
                        if missing:
                            return self._send(400, {"detail": f'"{missing[0]}" key is expected in task data'})
                    ids = []
                    with fake._lock:
                        for task in body:
                            tid = fake._next_task
                            fake._next_task += 1
                            fake.tasks[tid] = {
                                "id": tid,
                                "project": project["id"],
                                "data": task["data"],
                                "predictions": task.get("predictions", []),
                                "annotations": [],
                            }
                            ids.append(tid)
                    return self._send(201, {"task_count": len(ids), "task_ids": ids})
                if url.path == "/api/tasks/" and method == "GET":
                    rows = [t for t in fake.tasks.values() if t["project"] == int(query["project"])]
                    page, size = int(query.get("page", 1)), int(query.get("page_size", 100))
                    chunk = rows[(page - 1) * size : page * size]
                    if page > 1 and not chunk:
                        return self._send(404, {"detail": "Invalid page."})
                    return self._send(200, {"tasks": chunk, "total": len(rows)})
                if url.path == "/api/ml/" and method == "GET":
                    return self._send(200, [])
                if url.path == "/api/dm/views/" and method == "GET":
                    rows = [v for v in fake.views.values() if v["project"] == int(query["project"])]
                    return self._send(200, rows)
                if url.path == "/api/dm/views/" and method == "POST":
                    with fake._lock:
                        vid = fake._next_view
                        fake._next_view += 1
                        fake.views[vid] = {"id": vid, "project": body["project"], "data": body["data"]}
                    return self._send(201, fake.views[vid])
                if (m := re.fullmatch(r"/api/dm/views/(\d+)/", url.path)) and method == "PUT":
                    if int(m[1]) not in fake.views:
                        return self._send(404, {"detail": "Not found."})
                    fake.views[int(m[1])] = {"id": int(m[1]), "project": body["project"], "data": body["data"]}
                    return self._send(200, fake.views[int(m[1])])
                if (m := re.fullmatch(r"/api/annotations/(\d+)/", url.path)) and method == "GET":
                    for task in fake.tasks.values():
                        for a in task["annotations"]:
                            if a["id"] == int(m[1]):
                                return self._send(200, a)
                    return self._send(404, {"detail": "Not found."})
                if (m := re.fullmatch(r"/api/tasks/(\d+)/annotations/", url.path)) and method == "GET":
                    task = fake.tasks.get(int(m[1]))
                    return self._send(200, task["annotations"]) if task else self._send(404, {"detail": "Not found."})
                return self._send(404, {"detail": "Not found."})

            def do_GET(self) -> None:
                self._route("GET")

            def do_POST(self) -> None:
                self._route("POST")

            def do_PUT(self) -> None:
                self._route("PUT")

            def do_PATCH(self) -> None:
                self._route("PATCH")

        return Handler


@contextmanager
def fake_labelstudio(**kwargs: Any) -> Iterator[FakeLabelStudio]:
    fake = FakeLabelStudio(**kwargs).start()
    try:
        yield fake
    finally:
        fake.stop()
