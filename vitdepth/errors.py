"""One error type for bad user input, so every entry point can answer it with one line and exit 2."""

import errno
import os


class UsageError(ValueError):
    """Bad input from a user (config, flag, data path): the message names the value and the fix."""


def choice_error(what: str, value, choices) -> UsageError:
    """An error that names the bad value and lists the valid ones."""
    return UsageError(f"unknown {what} {value!r}; choose one of: {', '.join(map(str, choices))}")


def disk_full_error(error: OSError, path: str | os.PathLike) -> UsageError | None:
    """A full disk or quota is the user's to fix, not a bug: one line naming the file and the fix."""
    if error.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    return UsageError(f"no space left on the device writing {path} ({error.strerror}); the previous version is "
                      "kept: free space (or give --run_root on another disk) and rerun the same command to resume")
