"""The parent side of :mod:`worker.encoder_child`: one sandboxed child process per encoder in use.

:class:`EncoderProcess` starts the child lazily (on the first batch), sends it input batches and
reads its outputs under a wall-clock limit. A child that exceeds the limit is killed (its whole
process group) and :class:`EncoderLimitExceeded` is raised; one that dies (memory limit, crash)
raises it too; the next batch starts a fresh child. The error messages say which limit was hit.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from service import catalog
from service.sandbox import child_command, child_env
from worker.encoder_child import ENCODER_ERROR, HEADER, INPUT_ERROR, OK, REPLY

log = logging.getLogger(__name__)

START_TIMEOUT_SECONDS = 120.0  # import torch and load the module


class EncoderError(Exception):
    """The encoder itself cannot run (missing package, unloadable module, wrong output shape): every item
    would fail alike, so the job fails with this message. (Defined here, below :mod:`worker.encoders`,
    which re-exports it: the child process raises it too.)"""


class EncoderLimitExceeded(Exception):
    """The encoder ran past its time limit or died (memory limit, crash) on a batch: the batch's items
    fail with this message; they are not retried one by one (each would hit the same limit)."""


class EncoderInputError(RuntimeError):
    """The encoder's forward pass raised on a batch (its message is the module's): retried per item."""


class EncoderProcess:
    """A child process running one TorchScript module (bytes ``data``) on ``device``.

    Args:
        timeout: wall-clock seconds one forward pass may take.
        memory_bytes: ``RLIMIT_AS`` of the child beyond what it maps with torch imported (not applied
            on CUDA devices: the driver reserves address space far beyond what it uses).
    """

    def __init__(self, data: bytes, device: str, *, timeout: float, memory_bytes: int | None) -> None:
        self.data = data
        self.device = device
        self.timeout = float(timeout)
        self.memory_bytes = None if device.startswith("cuda") else memory_bytes
        self.proc: subprocess.Popen[bytes] | None = None
        self.workdir: str | None = None
        self.env: dict[str, str] | None = None  # what the child was given (kept for inspection)

    # ---------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self.workdir = tempfile.mkdtemp(prefix="bait-encoder-")
        model = Path(self.workdir) / "model.pt"
        model.write_bytes(self.data)
        args = [str(model), self.device]
        if self.memory_bytes:
            args += ["--memory-bytes", str(self.memory_bytes)]
        self.env = child_env(self.workdir)
        with open(Path(self.workdir) / "stderr", "wb") as err:
            self.proc = subprocess.Popen(
                child_command(catalog.ENCODER_CHILD, *args),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                cwd=self.workdir,
                env=self.env,
                close_fds=True,
                start_new_session=True,
            )
        status, payload = self._read_reply(max(START_TIMEOUT_SECONDS, self.timeout), "load")
        if status != OK:
            self.close()
            raise EncoderError(payload.decode("utf-8", "replace"))

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            try:
                if proc.poll() is None and proc.stdin is not None:
                    proc.stdin.write(HEADER.pack(0))
                    proc.stdin.flush()
                    proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self._kill(proc)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: nothing left to clean reliably
            self.close()

    # ---------------------------------------------------------------------------------------- use

    def run(self, x: np.ndarray) -> np.ndarray:
        """``N x ...`` float32 inputs -> ``N x d`` float32 outputs of the module.

        Raises:
            EncoderLimitExceeded: past the time limit, or the child died.
            EncoderInputError: the forward pass raised on this batch.
            EncoderError: the module cannot load or returned something other than one row per input.
        """
        if self.proc is None or self.proc.poll() is not None:
            self.close()
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(x, dtype=np.float32), allow_pickle=False)
        payload = buf.getvalue()
        try:
            self.proc.stdin.write(HEADER.pack(len(payload)))
            self.proc.stdin.write(payload)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._died("forward") from None
        status, reply = self._read_reply(self.timeout, "forward")
        if status == OK:
            out: np.ndarray = np.load(io.BytesIO(reply), allow_pickle=False)
            return out
        message = reply.decode("utf-8", "replace")
        if status == INPUT_ERROR:
            if self.memory_bytes and "allocate memory" in message:
                message += f" (memory limit {self.memory_bytes} bytes, BAIT_ENCODER_MEMORY_BYTES)"
            raise EncoderInputError(message)
        assert status == ENCODER_ERROR
        raise EncoderError(message)

    # ----------------------------------------------------------------------------------- plumbing

    def _read_reply(self, timeout: float, what: str) -> tuple[int, bytes]:
        head = self._read_exact(REPLY.size, timeout, what)
        status, n = REPLY.unpack(head)
        return status, self._read_exact(n, timeout, what) if n else b""

    def _read_exact(self, n: int, timeout: float, what: str) -> bytes:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        chunks: list[bytes] = []
        while n > 0:
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(0.0, left))[0] if left > 0 else []
            if not ready:
                self._kill(self.proc)
                self.proc = None
                raise EncoderLimitExceeded(
                    f"the encoder did not finish within its time limit of {timeout:g} s "
                    f"({'loading' if what == 'load' else 'one batch'}; BAIT_ENCODER_TIMEOUT_SECONDS); "
                    "its process was stopped"
                )
            chunk = os.read(fd, min(n, 1 << 20))
            if not chunk:
                raise self._died(what)
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def _died(self, what: str) -> EncoderLimitExceeded:
        proc, self.proc = self.proc, None
        code = None
        if proc is not None:
            try:
                code = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._kill(proc)
        how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit status {code}"
        limit = f"; memory limit {self.memory_bytes} bytes (BAIT_ENCODER_MEMORY_BYTES)" if self.memory_bytes else ""
        return EncoderLimitExceeded(f"the encoder process died during {what} ({how}{limit}){self._stderr_tail()}")

    def _stderr_tail(self) -> str:
        if self.workdir is None:
            return ""
        try:
            tail = (Path(self.workdir) / "stderr").read_bytes()[-300:].decode("utf-8", "replace").strip()
        except OSError:
            return ""
        return f": {tail.splitlines()[-1]}" if tail else ""

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.warning("encoder child %d did not exit after SIGKILL", proc.pid)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
