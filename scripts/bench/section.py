"""One section of BENCHMARKS.md written by a benchmark script other than scripts/bench.sh: replaced where it
stands, else added after the marker that scripts/bench.sh keeps (the marker added first when missing)."""

import os

MARKER = "<!-- measured by other scripts: kept by scripts/bench.sh -->"


def put(md, heading, section):
    """Write `section` (starting with the line `heading`) into the file `md`."""
    text = open(md).read() if os.path.exists(md) else ""
    start = text.find(heading)
    if start >= 0:
        nxt = text.find("\n## ", start + 1)
        text = text[:start] + section + (text[nxt + 1:] if nxt >= 0 else "")
    elif MARKER in text:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        text = text.rstrip("\n") + "\n\n" + MARKER + "\n\n" + section
    with open(md, "w") as f:
        f.write(text)
