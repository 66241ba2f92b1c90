"""The twin axis: the one engine knob every test cell is compared on, named in one place.

Each cell of the knob's "on" arm (the test) is judged against its twin of the "off" arm (the
reference): the same engine configuration, batch and prompts with only the knob changed. The arm
names are data on disk (cells.parquet's ``arm`` column, run.json's cells, the samples' records,
pair ids such as ``tp1-b8-cascade~flat``), so they must not change; the planner, the pairing, the
engines and the reports read them from here instead of spelling them. Comparing another knob
later is another instance of :class:`TwinAxis`.

Standard library only, and nothing from this package: every layer imports it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TwinAxis:
    """One on/off engine knob, as the matrix, the pairs and the reports name it."""

    # The MatrixSpec field (TOML key, --flag, run.json spec key) holding the knob's on/off list.
    spec_field: str
    # The arm with the knob on: the cells under test.
    test: str
    # The arm with the knob off: the twin each test cell is judged against, and the arm the noise
    # controls compare with itself.
    ref: str
    # The pairs table's kind of a test cell against its twin (beside calibration and noise-*).
    pair_kind: str
    # How the reports head a test sample and its twin's.
    test_label: str
    ref_label: str

    @property
    def arms(self) -> tuple[str, str]:
        """Both arm names, test first."""
        return (self.test, self.ref)

    def arm(self, on: bool) -> str:
        """The arm name of the knob's value ``on``."""
        return self.test if on else self.ref


# vLLM's cascade attention on (disable_cascade_attn=False, or the hf engine's reference cascade)
# against the same engine with it off.
CASCADE = TwinAxis(
    spec_field="cascade",
    test="cascade",
    ref="flat",
    pair_kind="cascade",
    test_label="cascade (test)",
    ref_label="flat (ref)",
)
