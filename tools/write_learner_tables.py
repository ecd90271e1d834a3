"""Write the registry's learner tables (`ggpo_offline.train.learner_table`) into README.md, docs/learners.md
and docs/corrections.md: `python tools/write_learner_tables.py`, or `python tools/write_learner_tables.py
PATH` for that README only."""

import sys
from pathlib import Path

from ggpo_offline.train.learner_table import with_ablations_table, with_corrections_table, with_learner_table

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LEARNERS_DOC = ROOT / "docs" / "learners.md"
CORRECTIONS_DOC = ROOT / "docs" / "corrections.md"


def main(arguments: list[str]) -> None:
    targets = {Path(arguments[0]): with_learner_table} if arguments else {
        README: with_learner_table,
        LEARNERS_DOC: with_ablations_table,
        CORRECTIONS_DOC: with_corrections_table,
    }  # fmt: skip
    for path, rewrite in targets.items():
        path.write_text(rewrite(path.read_text()))
        print(f"wrote the learner table into {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
