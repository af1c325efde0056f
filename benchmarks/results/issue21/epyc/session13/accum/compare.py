"""Every loss two runs' ``metrics.jsonl`` record, compared bit for bit (same steps, same
values).  Usage: python compare.py RUN_A RUN_B"""

import json
import sys
from pathlib import Path


def losses(run: Path) -> list[tuple[int, str, float]]:
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        out += [(r.get("step"), k, v) for k, v in r.items() if "loss" in k]
    return out


a, b = (losses(Path(p)) for p in sys.argv[1:3])
same = a == b
print(f"{len(a)} and {len(b)} losses; identical: {same}; last: {a[-3:]}")
sys.exit(0 if same else 1)
