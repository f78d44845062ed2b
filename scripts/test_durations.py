"""Write tests/durations.json (each test file's seconds, which orders the files of a run: longest
first, tests/conftest.py) from the output of a whole run with every duration listed:

    bash scripts/test.sh --durations=0 | tee run.log
    python scripts/test_durations.py run.log
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

LINE = re.compile(r"([\d.]+)s (?:setup|call|teardown)\s+tests/(\S+?)::")


def main(log: str) -> int:
    seconds: Counter[str] = Counter()
    for line in Path(log).read_text().splitlines():
        match = LINE.search(line)
        if match:
            seconds[match.group(2)] += float(match.group(1))
    if not seconds:
        print(f"test_durations: {log} lists no durations (run with --durations=0)", file=sys.stderr)
        return 1
    out = Path(__file__).resolve().parent.parent / "tests" / "durations.json"
    out.write_text(json.dumps({f: round(s, 1) for f, s in sorted(seconds.items())}, indent=1) + "\n")
    print(f"test_durations: {len(seconds)} files, {sum(seconds.values()):.0f} s in all -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]) if len(sys.argv) == 2 else "usage: python scripts/test_durations.py RUN_LOG")
