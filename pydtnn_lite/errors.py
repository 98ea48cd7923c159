"""Errors caused by the user's input or data, reported as one line with the fix, never a traceback."""


class UserError(Exception):
    """Base of errors whose message alone tells the user what is wrong and what to do."""


class TrainingError(UserError):
    """Training cannot go on (e.g. the loss became NaN)."""


class CollectiveTimeout(UserError):
    """A collective waited longer than --collective-timeout: some ranks never arrived."""
