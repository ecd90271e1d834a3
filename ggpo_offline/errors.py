"""The one exception type for bad user input: the CLI prints its message as a single line."""


class UserError(Exception):
    """A problem with the user's input or environment, reported as one line without a traceback."""
