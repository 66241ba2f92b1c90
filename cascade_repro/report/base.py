"""The interface every report format implements: the matrix run's and `cascade-repro kernel`'s."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

if TYPE_CHECKING:
    from cascade_repro.report.load import RunData

D = TypeVar("D")


class Formatter(ABC, Generic[D]):
    """Render one report file from the data it is made from."""

    name: ClassVar[str]
    filename: ClassVar[str]

    @abstractmethod
    def render(self, data: D) -> str:
        """Return the whole file as text; same data, same bytes."""


class ReportFormatter(Formatter["RunData"]):
    """Render a loaded run (a matrix run directory) into the text of one report file."""

    @abstractmethod
    def render(self, data: RunData) -> str:
        """Return the whole file as text; same data, same bytes."""
