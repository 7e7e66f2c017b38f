"""`flowc test --junit FILE`: the outcomes as JUnit XML, the report CI systems read (Jenkins,
GitLab, GitHub Actions' test reporters), in the common Ant/Jenkins form: one `<testsuite>`
per pipeline, one `<testcase>` per case, a `<failure>` holding the diff of a case whose events
differ, an `<error>` for a case that could not run.

Everything but the `time` attributes (seconds, as CI systems show them) is deterministic:
suites and cases sorted, no timestamp or host name.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from flowc.citools.golden import ERROR, FAILED, Outcome

# what XML 1.0 cannot hold at all (control characters but tab, newline and return; lone
# surrogates; U+FFFE/U+FFFF): shown as \xNN / \uNNNN escapes, so a role's coloured error
# (ANSI escapes) still makes a report every parser reads
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: str) -> str:
    return _NOT_XML.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _suite_name(outcome: Outcome) -> str:
    case = outcome.case
    return case.pipeline.as_posix() if case.pipeline is not None else case.input.parent.as_posix()


def junit_xml(outcomes: list[Outcome]) -> str:
    suites: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        suites.setdefault(_suite_name(outcome), []).append(outcome)
    totals = {k: v for k, v in _counts(outcomes).items() if k != "skipped"}  # <testsuites> has no `skipped`
    root = ET.Element("testsuites", {"name": "flowc test"} | totals)
    for name in sorted(suites):
        members = sorted(suites[name], key=lambda o: o.case.label)
        suite = ET.SubElement(root, "testsuite", {"name": name} | _counts(members))
        classname = name.removesuffix(".flow").replace("/", ".").strip(".") or "flowc"
        for outcome in members:
            case = ET.SubElement(
                suite,
                "testcase",
                {
                    "name": xml_text(outcome.case.label),
                    "classname": classname,
                    "file": outcome.case.input.as_posix(),
                    "time": f"{outcome.seconds:.3f}",
                },
            )
            if outcome.verdict == FAILED:
                first = outcome.detail.splitlines()[0] if outcome.detail else "failed"
                message = "events differ from the recording" if first.startswith("--- ") else first
                failure = ET.SubElement(case, "failure", {"message": xml_text(message), "type": "flowc.events"})
                failure.text = xml_text(outcome.detail)
            elif outcome.verdict == ERROR:
                first = outcome.detail.splitlines()[0] if outcome.detail else "error"
                ET.SubElement(case, "error", {"message": xml_text(first), "type": "flowc.case"}).text = xml_text(outcome.detail)
            elif outcome.detail:
                ET.SubElement(case, "system-out").text = xml_text(outcome.detail)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _counts(outcomes: list[Outcome]) -> dict[str, str]:
    return {
        "tests": str(len(outcomes)),
        "failures": str(sum(o.verdict == FAILED for o in outcomes)),
        "errors": str(sum(o.verdict == ERROR for o in outcomes)),
        "skipped": "0",
        "time": f"{sum(o.seconds for o in outcomes):.3f}",
    }
