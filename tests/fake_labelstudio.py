"""A small Label Studio stand-in served for real on 127.0.0.1 (a test peer, not a mock of our code).

It speaks the few endpoints the service calls, with Label Studio's shapes and status codes: token auth
(``Authorization: Token <token>``; 401 otherwise), ``GET /api/projects/{id}/``, ``POST
/api/projects/{id}/import?return_task_ids=true`` (400 when a task lacks a field the labeling config
shows, as Label Studio does), ``GET /api/tasks/?project=&page=&page_size=&fields=all`` (404 past the last
page) and ``GET /api/tasks/{id}/annotations/``. Tests annotate tasks with :meth:`FakeLabelStudio.annotate`.
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
                if (m := re.fullmatch(r"/api/tasks/(\d+)/annotations/", url.path)) and method == "GET":
                    task = fake.tasks.get(int(m[1]))
                    return self._send(200, task["annotations"]) if task else self._send(404, {"detail": "Not found."})
                return self._send(404, {"detail": "Not found."})

            def do_GET(self) -> None:
                self._route("GET")

            def do_POST(self) -> None:
                self._route("POST")

        return Handler


@contextmanager
def fake_labelstudio(**kwargs: Any) -> Iterator[FakeLabelStudio]:
    fake = FakeLabelStudio(**kwargs).start()
    try:
        yield fake
    finally:
        fake.stop()
