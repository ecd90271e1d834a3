"""Stage one: sample responses with an engine, score them, and write them as a pool."""
