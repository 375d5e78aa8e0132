#!/usr/bin/env python3
"""Encoding throughput of HF `tokenizers` (Python binding) on a jsonl file, for comparison with
`loongforge-data bench-tokenizer` (docs/data.md). Benchmark only; the build never runs it.

    bench_hf_tokenizer.py TOKENIZER_JSON INPUT_JSONL [--key text]
"""
import json
import sys
import time

from tokenizers import Tokenizer


def main():
    tok = Tokenizer.from_file(sys.argv[1])
    key = sys.argv[sys.argv.index("--key") + 1] if "--key" in sys.argv else "text"
    docs = [json.loads(line)[key] for line in open(sys.argv[2], encoding="utf-8") if line.strip()]
    mb = sum(len(d.encode()) for d in docs) / 1e6
    for p in range(2):
        t = time.perf_counter()
        n = sum(len(tok.encode(d, add_special_tokens=False).ids) for d in docs)
        s = time.perf_counter() - t
        print(f"HF encode, one call per document, pass {p}: {len(docs)} docs, {mb:.2f} MB, {n} tokens, "
              f"{s:.3f} s, {mb / s:.2f} MB/s")
    t = time.perf_counter()
    n = sum(len(e.ids) for e in tok.encode_batch(docs, add_special_tokens=False))
    s = time.perf_counter() - t
    print(f"HF encode_batch (Rust threads): {mb:.2f} MB, {n} tokens, {s:.3f} s, {mb / s:.2f} MB/s")


if __name__ == "__main__":
    main()
