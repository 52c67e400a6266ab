"""report.md of a GPU check: the environment, the gpu tests' counts (and each failure's name), the bench's table.

python scripts/gpu_report.py OUT TESTS_STATUS SECONDS
"""

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def test_summary(xml_path: Path) -> list[str]:
    if not xml_path.exists():
        return ["no test report (pytest did not run)"]
    suite = ET.parse(xml_path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    lines = [", ".join(f"{value} {key}" for key, value in counts.items())]
    for case in suite.iter("testcase"):
        for outcome in ("failure", "error", "skipped"):
            found = case.find(outcome)
            if found is not None:
                message = (found.get("message") or "").splitlines()[0][:160] if found.get("message") else ""
                lines.append(f"- {outcome}: {case.get('name')} {message}")
    return lines


def main(out: Path, tests_status: str, seconds: str) -> None:
    print(f"# GPU check ({seconds} s)\n\n## Environment\n\n```")
    print((out / "environment.txt").read_text().strip() if (out / "environment.txt").exists() else "(none)")
    print(f"```\n\n## tests/gpu (pytest exit {tests_status})\n")
    print("\n".join(test_summary(out / "gpu_tests.xml")))
    bench = out / "gpu_bench.md"
    print("\n## Bench\n")
    print(bench.read_text() if bench.exists() else "(the bench wrote no table)")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
