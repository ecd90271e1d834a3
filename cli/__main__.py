"""`python -m ggpo_cli` is the `ggpo` command; torchrun starts it as `torchrun ... -m ggpo_cli train ...`."""

from ggpo_cli.main import main

if __name__ == "__main__":
    main()
