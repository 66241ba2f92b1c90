"""The JUnit XML document both test reports write: one testcase per cascade pair (``junit.py``) or
per kernel case (``kernel/report.py``), so CI systems show each failure as a failing test."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from cascade_repro.report.text import xml_safe

# The element of a testcase's outcome, and the count it adds to.
OUTCOMES = {"failure": "failures", "error": "errors", "skipped": "skipped"}


def element(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    """A child element; ElementTree escapes markup but writes XML-invalid characters as-is, so
    they are stripped here."""
    e = ET.SubElement(parent, tag, {k: xml_safe(v) for k, v in attrs.items()})
    if text is not None:
        e.text = xml_safe(text)
    return e


class JunitDocument:
    """``<testsuites>`` holding a ``<testsuite>`` (its ``<properties>`` first; ``add_suite``: more); the counts of tests,
    failures and errors and the total time are set on both when rendered, the skips on the suite
    only: Jenkins' JUnit schema (junit-10.xsd, which pytest validates against) has no ``skipped``
    on ``<testsuites>``."""

    def __init__(self, name: str, **suite_attrs: str) -> None:
        self.root = ET.Element("testsuites", name=name)
        self.suites: list[tuple[ET.Element, dict[str, int]]] = []
        self.add_suite(name, **suite_attrs)

    def add_suite(self, name: str, **suite_attrs: str) -> None:
        """Another ``<testsuite>`` (a run of several twins: one per twin), the current one from now on."""
        self.suite = element(self.root, "testsuite", name=name, **suite_attrs)
        self.properties = element(self.suite, "properties")
        self.counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        self.suites.append((self.suite, self.counts))

    def drop_first_suite(self) -> None:
        """Remove the suite made with the document (its suites are all added by ``add_suite``)."""
        first, _ = self.suites.pop(0)
        self.root.remove(first)

    def add_property(self, name: str, value: str) -> None:
        element(self.properties, "property", name=name, value=value)

    def testcase(self, **attrs: str) -> ET.Element:
        self.counts["tests"] += 1
        return element(self.suite, "testcase", **attrs)

    def outcome(self, case: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
        """A testcase's ``failure``, ``error`` or ``skipped`` element, counted."""
        self.counts[OUTCOMES[tag]] += 1
        return element(case, tag, text, **attrs)

    def render(self, total_s: Any = None) -> str:
        totals = {k: sum(c[k] for _, c in self.suites) for k in self.counts}
        # The run's wall time on every suite where there is one; of several, on the whole only.
        timed = [self.root, *(s for s, _ in self.suites[:1] if len(self.suites) == 1)]
        for el, counts in [(self.root, totals), *self.suites]:
            for k, v in counts.items():
                if k != "skipped" or el is not self.root:
                    el.set(k, str(v))
            if isinstance(total_s, int | float) and el in timed:
                el.set("time", f"{total_s:.3f}")
        ET.indent(self.root, space="  ")
        return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(self.root, encoding="unicode") + "\n"
