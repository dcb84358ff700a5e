"""User-facing errors: one clear line naming the file, line or flag; the CLIs print them without a traceback."""


class SeqtrainError(Exception):
    """An error caused by the user's input (files, flags, checkpoints). Message is one line, self-explaining."""


class Stopped(SystemExit):
    """A run that a signal (SIGTERM, SIGINT) stopped cleanly: exits with 128 + the signal number (the shell's
    convention: 143, 130); `message` is the one line the CLIs print, saying what was kept."""

    def __init__(self, signum: int, message: str):
        super().__init__(128 + signum)
        self.signum, self.message = signum, message
