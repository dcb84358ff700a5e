"""User-facing errors: one clear line naming the file, line or flag; the CLIs print them without a traceback."""


class SeqtrainError(Exception):
    """An error caused by the user's input (files, flags, checkpoints). Message is one line, self-explaining."""
