"""User-facing errors: one line naming the file, the key path and the reason; the CLI exits with status 2."""
from __future__ import annotations

from dpx.models.choices import did_you_mean  # noqa: F401  the one did-you-mean of dpx (models may not import us)


class RecipeError(Exception):
    """Bad input. `str(e)` is the one line the user sees."""

    def __init__(self, reason: str, file: str | None = None, key: str | None = None):
        self.reason, self.file, self.key = reason, file, key
        super().__init__(self.line())

    def line(self) -> str:
        where = ":".join(p for p in (self.file, self.key) if p)
        text = f"{where}: {self.reason}" if where else self.reason
        # one line whatever the parts hold (YAML reader errors span lines; keys may contain line breaks)
        return " ".join(part.strip() for part in text.splitlines())

