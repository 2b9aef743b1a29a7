"""The one exception type for bad configuration."""

from __future__ import annotations

from hybridflow.utils.errors import InputError


class ConfigError(InputError, ValueError):
    """One or more configuration problems, each naming the dotted key and saying why.

    ``problems`` holds the individual messages; ``str(err)`` lists them all, so a user fixes
    every mistake in one go instead of one per run.
    """

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if len(self.problems) == 1:
            message = f"invalid config: {self.problems[0]}"
        else:
            message = "invalid config:\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(message)
