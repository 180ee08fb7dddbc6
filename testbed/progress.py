"""A progress bar for long runs: requests done, run time (simulated or wall), tokens/s."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, enabled: bool, label: str = "sim"):
        self.total = total
        self.enabled = enabled
        self.label = label
        self._bar = None
        self._last = 0.0
        self._done = 0
        if enabled:
            from tqdm import tqdm
            self._bar = tqdm(total=total, unit="req", file=sys.stderr, dynamic_ncols=True, mininterval=0.2)

    def __call__(self, done: int, total: int, now: float, output_tokens: int) -> None:
        if self._bar is None:
            return
        t = time.monotonic()
        if t - self._last < 0.2 and done < total:
            return
        self._last = t
        self._bar.update(done - self._done)
        self._done = done
        rate = output_tokens / now if now > 0 else 0.0
        self._bar.set_postfix_str(f"{self.label} t={now:,.1f}s, {rate:,.0f} output tok/s", refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
