#!/usr/bin/env python3
"""Write documents whose later text depends on text far back, for the context-extension example.

Each document is a passage of PERIOD bytes cut from a Go source file, written REPEATS times in a row:
from byte PERIOD on, every byte equals the one PERIOD bytes earlier. A model whose context is
shorter than PERIOD cannot see that copy and predicts the repeats as fresh text; a model that
attends PERIOD tokens back can predict them almost exactly. Passages are consecutive, non-overlapping
PERIOD-byte pieces of each file (files in sorted path order), ASCII only (a piece holding another
byte is skipped), the first --docs of them. An --out ending in .jsonl gets one {"text": ...}
object per line (data.format = "jsonl"); any other --out is a new directory of text files, one
document each, named 00000.txt, 00001.txt... in order (data.format = "text", and the --docs glob
of scripts/reference.py read-hf).

    python3 scripts/longdocs.py --src "$(go env GOROOT)/src" --out train.jsonl --docs 4000
    python3 scripts/longdocs.py --src "$(go env GOROOT)/test" --out eval --docs 64
"""

import argparse
import json
import os
import sys


def passages(src, period):
    """Yields the ASCII PERIOD-byte pieces of the *.go files under src, in sorted path order."""
    paths = []
    for root, dirs, files in os.walk(src):
        dirs.sort()
        paths.extend(os.path.join(root, f) for f in files if f.endswith(".go"))
    for path in sorted(paths):
        with open(path, "rb") as f:
            raw = f.read()
        for i in range(0, len(raw) - period + 1, period):
            piece = raw[i:i + period]
            if all(0 < b < 128 for b in piece):
                yield piece.decode("ascii")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True, help="directory of *.go files")
    ap.add_argument("--out", required=True, help="a .jsonl file, else a new directory of text files")
    ap.add_argument("--docs", type=int, required=True, help="documents written")
    ap.add_argument("--period", type=int, default=96, help="bytes in a passage (the copy distance)")
    ap.add_argument("--repeats", type=int, default=4, help="copies of the passage in a document")
    a = ap.parse_args()
    for name in ("docs", "period", "repeats"):
        if getattr(a, name) < 1:
            sys.exit(f"longdocs: --{name} {getattr(a, name)}: want at least 1")
    if not a.out.endswith(".jsonl") and os.path.exists(a.out):
        sys.exit(f"longdocs: --out {a.out} exists: want a new directory (or a .jsonl file)")
    docs = []
    for p in passages(a.src, a.period):
        if len(docs) == a.docs:
            break
        docs.append(p * a.repeats)
    if len(docs) < a.docs:
        sys.exit(f"longdocs: {a.src} holds {len(docs)} passages of {a.period} ASCII bytes, --docs asks {a.docs}")
    if a.out.endswith(".jsonl"):
        with open(a.out, "w") as out:
            out.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    else:
        os.mkdir(a.out)
        for i, d in enumerate(docs):
            with open(os.path.join(a.out, "%05d.txt" % i), "w") as out:
                out.write(d)
    print(f"{a.out}: {len(docs)} documents of {a.period * a.repeats} bytes")


if __name__ == "__main__":
    main()
