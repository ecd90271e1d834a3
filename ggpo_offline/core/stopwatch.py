"""Wall seconds summed per named stretch of work, for a caller that reports them as phases of its own."""

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Stopwatch:
    """``seconds[name]``: the wall seconds of every block timed as ``name`` so far."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def timing(self, name: str) -> Iterator[None]:
        """Add the block's wall seconds to ``name`` (also when it raises: the time was spent)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
