"""`torchrun --nproc_per_node N -m ggpo_offline.train [ggpo train flags]`: one process of a training job."""

import sys

from ggpo_cli.main import main

if __name__ == "__main__":
    main(["train", *sys.argv[1:]])
