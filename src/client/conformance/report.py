"""The run's report: a table for people, JSON and JUnit XML for CI."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from xml.etree import ElementTree as ET

from pyrigaud.client.conformance.runner import Outcome, Report

REASON_WIDTH = 70


def table(report: Report) -> str:
    key_width = max((len(result.key) for result in report.results), default=6)
    lines = [f"{'CLAUSE':<{key_width}}  {'RESULT':<7}  {'TIME':>7}  REASON"]
    for result in report.results:
        reason = textwrap.wrap(result.reason, REASON_WIDTH) or [""]
        lines.append(
            f"{result.key:<{key_width}}  {result.outcome.value:<7}  "
            f"{result.seconds:>6.2f}s  {reason[0]}".rstrip()
        )
        lines.extend(" " * (key_width + 20) + more for more in reason[1:])
    counts = {outcome: 0 for outcome in Outcome}
    for result in report.results:
        counts[result.outcome] += 1
    summary = ", ".join(f"{count} {outcome.value}" for outcome, count in counts.items() if count)
    lines.append("")
    lines.append(f"{report.endpoint}: {summary}")
    lines.extend(f"cleanup: {problem}" for problem in report.cleanup_problems)
    lines.extend(f"left: {what} (no RPC removes it)" for what in report.left)
    if report.interrupted:
        lines.append("interrupted: the run's VMs were removed")
    lines.append("CONFORMANT" if report.ok else "NOT CONFORMANT")
    return "\n".join(lines)


def as_json(report: Report) -> str:
    return json.dumps(
        {
            "endpoint": report.endpoint,
            "ok": report.ok,
            "interrupted": report.interrupted,
            "cleanup_problems": list(report.cleanup_problems),
            "left": list(report.left),
            "clauses": [
                {
                    "clause": result.key,
                    "title": result.title,
                    "result": result.outcome.value,
                    "seconds": round(result.seconds, 3),
                    "reason": result.reason,
                }
                for result in report.results
            ],
        },
        indent=2,
    )


def junit(report: Report) -> str:
    suite = ET.Element(
        "testsuite",
        name="provider.v1 conformance",
        tests=str(len(report.results)),
        failures=str(sum(r.outcome is Outcome.FAILED for r in report.results)),
        errors=str(sum(r.outcome is Outcome.NOT_RUN for r in report.results)),
        skipped=str(sum(r.outcome is Outcome.SKIPPED for r in report.results)),
        time=f"{sum(r.seconds for r in report.results):.3f}",
    )
    for result in report.results:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=report.endpoint,
            name=result.key,
            time=f"{result.seconds:.3f}",
        )
        if result.outcome is Outcome.FAILED:
            ET.SubElement(case, "failure", message=result.reason).text = result.title
        elif result.outcome is Outcome.SKIPPED:
            ET.SubElement(case, "skipped", message=result.reason)
        elif result.outcome is Outcome.NOT_RUN:
            ET.SubElement(case, "error", message=result.reason)
    for problem in report.cleanup_problems:
        case = ET.SubElement(suite, "testcase", classname=report.endpoint, name="cleanup")
        ET.SubElement(case, "failure", message=problem)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)


def write(path: Path, text: str) -> None:
    path.write_text(text + "\n", encoding="utf-8")
