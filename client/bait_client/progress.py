"""Progress bars (tqdm): one per job stage while waiting for a batch, one per upload."""

from __future__ import annotations

from typing import Any

from tqdm import tqdm


class StageBar:
    """A progress bar per stage of a job: labelled with the stage running now, counting to that stage's
    total (none shown while the stage has not reported one yet)."""

    def __init__(self, enabled: bool = True, file: Any = None) -> None:
        self.enabled = enabled
        self.file = file
        self.stage: str | None = None
        self._bar: Any = None

    def show(self, stage: str, done: int, total: int) -> None:
        if self._bar is None or stage != self.stage:
            self.close()
            self.stage = stage
            self._bar = tqdm(
                total=total or None, desc=stage, unit="step", disable=not self.enabled, leave=False, file=self.file
            )
        elif total and self._bar.total != total:
            self._bar.reset(total=total)
        self._bar.n = min(done, total) if total else done
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def upload_bar(total: int, initial: int = 0, *, enabled: bool = True, file: Any = None) -> Any:
    """One bar for a whole upload, in rows (a resumed upload starts at the rows already sent)."""
    return tqdm(
        total=total, initial=initial, desc="upload", unit="item", unit_scale=True, disable=not enabled, file=file
    )
