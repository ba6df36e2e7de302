"""`bait demo`: the whole loop (pool, upload, seed labels, three rounds, accuracy, clean-up) against the app,
on scikit-learn's bundled digits (small sizes), reproducibly; and its one-line errors."""

from __future__ import annotations

import io
import socket
import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bait.cli import main
from service.demo import run_loop
from tests.conftest import RunJobs

SMALL = {"rounds": 3, "batch_size": 5, "n_seed": 20, "n_heldout": 60, "n_items": 260, "poll": 0.02}


def demo_in_thread(client: TestClient, auth: dict[str, str], run_jobs: RunJobs) -> tuple[list[float], list[str]]:
    """Run the demo's loop (it polls) while this thread works the queue (RQ burst workers, or in-process)."""
    out = io.StringIO()
    result: dict[str, Any] = {}
    client.headers.update(auth)

    def target() -> None:
        try:
            result["acc"] = run_loop(client, out=out, **SMALL)  # type: ignore[arg-type]
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    run_jobs(until=lambda: not thread.is_alive(), timeout=300)
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["acc"], out.getvalue().splitlines()


def test_demo_runs_the_loop_prints_each_round_and_deletes_its_pool(
    client: TestClient, auth: dict[str, str], run_jobs: RunJobs
) -> None:
    accuracies, lines = demo_in_thread(client, auth, run_jobs)
    assert len(accuracies) == 3 and all(0.0 <= a <= 1.0 for a in accuracies)
    assert accuracies[-1] > 0.5  # ten classes: far above chance after 30 labels
    assert lines[0].startswith("data: scikit-learn's digits, 260 images")
    assert lines[1].startswith("created pool digits-demo-")
    assert lines[2] == "uploaded 260 items in one .npz request; 60 of them measure accuracy"
    assert lines[3] == "labeled a random seed set of 20 items, at least 2 per class"
    for r in (1, 2, 3):
        at = lines.index(next(line for line in lines if line.startswith(f"round {r}: bait picked 5 items")))
        assert f"trained on {20 + 5 * (r - 1)} labels: accuracy {accuracies[r - 1]:.3f}" in lines[at + 1]
        assert lines[at + 2].strip() == "labeled the 5 picked items from the ground truth"
    assert lines[-1].startswith("deleted pool digits-demo-")
    assert client.get("/v1/pools", headers=auth).json() == {"pools": []}


def test_demo_is_reproducible(client: TestClient, auth: dict[str, str], run_jobs: RunJobs) -> None:
    first, lines_1 = demo_in_thread(client, auth, run_jobs)
    second, lines_2 = demo_in_thread(client, auth, run_jobs)
    assert first == second

    def numbers(lines: list[str]) -> list[str]:  # each round's objective and accuracy lines, without timings
        return [line.split(")")[-1] for line in lines if "objective" in line] + [
            line for line in lines if "accuracy" in line
        ]

    assert numbers(lines_1) == numbers(lines_2)


def test_demo_without_a_key_says_how_to_get_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("BAIT_API_KEY", raising=False)
    assert main(["demo"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no API key: pass --key or set BAIT_API_KEY") and "\n" not in err


def test_demo_against_no_service_says_to_start_one(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["demo", "--url", f"http://127.0.0.1:{port}", "--key", "bait_x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: cannot reach the service at http://127.0.0.1:{port}") and "make run" in err
    assert "\n" not in err and "Traceback" not in err


def test_demo_with_a_refused_key_says_so(client: TestClient, capsys: pytest.CaptureFixture[str]) -> None:
    from service.demo import Demo, DemoError

    with pytest.raises(DemoError, match="the service refused the API key"):
        Demo(client).call("GET", "/v1/pools")  # no Authorization header
