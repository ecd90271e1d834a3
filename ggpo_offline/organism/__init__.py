"""The embedded model organism: the tiny model, its styles and the recipe that builds it."""
