"""tests/test_learning.py's check, run on the framework presets: does each learn which behaviour each prompt
class calls for? The test runs it on the toolkit's own learners in every `make test`; on all 43 presets it
takes half an hour of one core, so it is run by hand and its table committed (docs/corrections/learning.md):

    .venv/bin/python tests/preset_learning.py > docs/corrections/learning.md

Same pool, held-out problems, updates, groups and rate (LR) as the test, one seed; a preset "learns" when its
conditioned gain exceeds the test's MIN_GAIN. `--methods a,b` runs those learners only.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from test_learning import (  # noqa: E402
    GROUPS,
    LR,
    MIN_GAIN,
    UPDATES,
    conditioned_gain,
    gains,
    held_out_questions,
    make_learning_pool,
    preferences,
)

from ggpo_offline.core.model_io import tiny_model_dir  # noqa: E402
from ggpo_offline.generate.engines import load_engine  # noqa: E402
from ggpo_offline.train.learners import CORRECTIONS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(entry.name for entry in CORRECTIONS))
    methods = parser.parse_args().methods.split(",")
    torch.set_num_threads(1)  # before the engine starts and binds the threads
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        engine = load_engine("vllm", tiny_model_dir(), dtype="auto", max_model_len=512, seed=0)
        pool = make_learning_pool(Path(folder), engine)
        engine.close()
        held_out = held_out_questions()
        baseline = preferences(tiny_model_dir(), held_out)
        rows = []
        for method in methods:
            gain = gains(method, pool, held_out, baseline, Path(folder))
            learned = "yes" if conditioned_gain(gain) > MIN_GAIN else "**no**"
            rows.append(
                f"| `{method}` | {gain['flat']:+.3f} | {gain['nested']:+.3f} | {conditioned_gain(gain):+.3f} "
                f"| {learned} |"
            )
            print(f"{method}: {conditioned_gain(gain):+.3f}", file=sys.stderr)
    minutes = (time.perf_counter() - started) / 60
    print("# Do the framework presets learn?\n")
    print(
        f"`python tests/preset_learning.py` ({time.strftime('%Y-%m-%d')}, {minutes:.0f} min, one thread): "
        f"{UPDATES} updates of {GROUPS} groups at lr {LR:g}, seed 0, on tests/test_learning.py's pool; the "
        "gain is the change of the log-odds of each class's best style over its rival at the first response "
        f"token on held-out validation problems; a preset learns when flat + nested exceeds {MIN_GAIN} nats "
        "(the test's threshold for the toolkit's learners). No test problem is used.\n"
    )
    print("| method | flat gain | nested gain | conditioned gain | learns |")
    print("|---|---:|---:|---:|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
