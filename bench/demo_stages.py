"""Benchmark 6: wall time of the 2-seed `make demo` job of 2026-12-02 by stage (generate-pool, validate, one
compare of 4 methods x 2 seeds at the preset's 128 x 8 evaluations) in a scratch folder, each stage also as a
share of the whole run; today's five-seed demo is timed on a fresh clone (README)."""

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GGPO = str(Path(sys.executable).parent / "ggpo")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        pool = str(Path(folder) / "base.parquet")
        stages = {
            "generate-pool": [GGPO, "generate-pool", "--out", pool],
            "pool validate": [GGPO, "pool", "validate", pool],
            "compare (4 methods x 2 seeds, tiny)": [
                GGPO, "compare", "--pool", pool, "--preset", "tiny", "--seeds", "42,1234",
                "--out", str(Path(folder) / "report"), "--no-tracking",
            ],
        }  # fmt: skip
        seconds = {}
        for name, command in stages.items():
            start = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True, cwd=folder)
            seconds[name] = time.perf_counter() - start
    total = sum(seconds.values())
    print("| stage | seconds | share of the demo |")
    print("|---|---:|---:|")
    for name, value in seconds.items():
        print(f"| {name} | {value:.0f} | {value / total:.0%} |")
    print(f"| total | {total:.0f} | 100% |")


if __name__ == "__main__":
    main()
