"""The interface every report format implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from cascade_repro.report.load import RunData


class ReportFormatter(ABC):
    """Render a loaded run into the text of one report file."""

    name: ClassVar[str]
    filename: ClassVar[str]

    @abstractmethod
    def render(self, data: RunData) -> str:
        """Return the whole file as text; same data, same bytes."""
