"""Jobs: a command's units of work (a compare's runs, a pool's shards) run by a launcher, here or on Slurm."""
