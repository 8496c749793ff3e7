"""Progress bars (tqdm) for what makes a first start slow: reading the model, compiling
its graphs and repacking its weights (the warm-up run). Shown only when `verbose` and stderr is a terminal, so scripts, pipes and CI
logs stay clean."""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator


class LoadProgress:
    def __init__(self, enabled: bool):
        self.enabled = enabled and sys.stderr.isatty()
        self._bar = None

    def loading(self, fraction: float) -> bool:
        """Model.load's progress callback (0.0 .. 1.0 per tensor)."""
        if not self.enabled:
            return True
        if self._bar is None:
            from tqdm import tqdm
            self._bar = tqdm(total=100, desc="loading model", unit="%", leave=False, file=sys.stderr)
        self._bar.n = int(fraction * 100)
        self._bar.refresh()
        return True

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    @contextlib.contextmanager
    def stage(self, desc: str) -> Iterator[None]:
        """A bar around one step of the start (compiling the graphs, the warm-up run that
        repacks the weights); these steps report no fractions, so the bar shows the time."""
        if not self.enabled:
            yield
            return
        from tqdm import tqdm
        with tqdm(total=1, desc=desc, leave=False, file=sys.stderr,
                  bar_format="{desc}: {elapsed}") as bar:
            yield
            bar.update(1)
