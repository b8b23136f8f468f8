"""The one exception type that means "the user gave us bad input".

The command line turns it into one line on stderr and exit status 2; any other
exception is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Bad input: a malformed file, an unknown preset, a plan that cannot fit."""
