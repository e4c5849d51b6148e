#!/usr/bin/env python3
"""Counts test cases over the JUnit logs of several meson build directories
(GoogleTest cases are counted one by one) and prints one closing line:
"tests: N passed, N failed, N skipped". Exits non-zero if any failed or no
test ran."""
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

passed = failed = skipped = 0
for build in sys.argv[1:]:
    log = Path(build) / "meson-logs" / "testlog.junit.xml"
    if not log.exists():
        print(f"{build}: no test log", file=sys.stderr)
        failed += 1
        continue
    for case in ET.parse(log).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
print(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed or passed == 0 else 0)
