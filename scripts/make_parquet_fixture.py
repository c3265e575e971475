#!/usr/bin/env python3
"""Write the Parquet fixture of data/parquet_test.go with pyarrow, the ecosystem's reference writer.

The Hugging Face Hub's Parquet files (its conversions of every dataset, FineWeb, DCLM, ...) are
written by pyarrow. The Go tests write their own files with parquet-go; this fixture makes sure a
file from pyarrow is read too. It writes into data/testdata/parquet/ (committed; the tests read it
without pyarrow, and CI does not run this script):

    docs.jsonl                the documents as JSON lines, {"id": N, "text": ...}: the reference;
                              rows whose text is null are left out (Parquet's nulls are skipped)
    docs-snappy.parquet       id int64, text string; snappy, dictionary-encoded, data pages v1
                              (pyarrow's defaults), several row groups
    docs-zstd.parquet         the same, zstd, data pages v2
    docs-gzip.parquet         the same, gzip, PLAIN encoding (no dictionary)
    docs-large-string.parquet text as large_string (snappy)
    docs-binary.parquet       text as binary (snappy)
    docs-nested.parquet       id, meta struct<lang string, body string> holding the text in
                              meta.body (data.text_key = "meta.body"), and tags list<string> (a
                              repeated column, refused as a text column)

The documents hold non-ASCII text, quotes, backslashes and newlines; some rows are null and one is
an empty string. Run it from the repository root (it needs pyarrow: pip install pyarrow):

    python3 scripts/make_parquet_fixture.py

and commit what it writes. The files are a few KB each.
"""

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

OUT = os.path.join("data", "testdata", "parquet")
ROWS = 60
ROW_GROUP = 16  # rows per row group: 4 row groups


def texts():
    """The text column: a string, None (null) or "" per row."""
    out = []
    for i in range(ROWS):
        if i % 11 == 3:
            out.append(None)
        elif i == 8:
            out.append("")
        else:
            out.append(
                "Row %d: «naïve» café, 日本語, emoji 🙂, \"quoted\" \\ back\tslash\n%s"
                % (i, "word " * (i % 9))
            )
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    text = texts()
    ids = pa.array(range(ROWS), pa.int64())

    with open(os.path.join(OUT, "docs.jsonl"), "w", encoding="utf-8") as f:
        for i, t in enumerate(text):
            if t is not None:
                f.write(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n")

    def write(name, table, **kw):
        pq.write_table(table, os.path.join(OUT, name), row_group_size=ROW_GROUP, **kw)

    strings = pa.table({"id": ids, "text": pa.array(text, pa.string())})
    write("docs-snappy.parquet", strings, compression="snappy")
    write("docs-zstd.parquet", strings, compression="zstd", data_page_version="2.0")
    write("docs-gzip.parquet", strings, compression="gzip", use_dictionary=False)
    write(
        "docs-large-string.parquet",
        pa.table({"id": ids, "text": pa.array(text, pa.large_string())}),
        compression="snappy",
    )
    binary = [None if t is None else t.encode("utf-8") for t in text]
    write(
        "docs-binary.parquet",
        pa.table({"id": ids, "text": pa.array(binary, pa.binary())}),
        compression="snappy",
    )
    meta = pa.array(
        [{"lang": "en", "body": t} for t in text],
        pa.struct([("lang", pa.string()), ("body", pa.string())]),
    )
    tags = pa.array([["a", "b"][: i % 3] for i in range(ROWS)], pa.list_(pa.string()))
    write(
        "docs-nested.parquet",
        pa.table({"id": ids, "meta": meta, "tags": tags}),
        compression="snappy",
    )
    for name in sorted(os.listdir(OUT)):
        print("%8d %s" % (os.path.getsize(os.path.join(OUT, name)), os.path.join(OUT, name)))


if __name__ == "__main__":
    main()
