// Package data turns text on disk into batches of token ids for training.
//
// The path from disk to batch:
//
//   - [ExpandPath] resolves a configured path: $GOROOT (so the default corpus, the Go
//     toolchain's own sources, exists on any machine that can build distflash), other
//     environment variables and a leading ~/.
//   - [LoadTokens] reads a [Source] (a file, a directory walked recursively, or a glob),
//     chooses and orders its files from a seed, and tokenizes them into one stream with a
//     newline between documents. Source.Format says what a document is: a whole file
//     (text), or the "text" field of each JSON line (jsonl, and c4 for allenai/c4's files,
//     gzip or zstd compressed); or the files are token shards (tokens). Data that is surely
//     not meant (a compressed file read as text, binary data) is an error naming the file;
//     Source.Log hears of the rest worth knowing (a read cut by MaxBytes, some invalid UTF-8).
//   - [WriteShards] writes that stream as token shards (a small header, then uint16 or
//     uint32 tokens and a table of where each document starts, with CRC-32C checksums;
//     [ReadShard], [ReadShardDocuments]), which LoadTokens reads back without tokenizing
//     again, verifying them; with a document boundary it joins their documents by it, as
//     it does text's.
//   - [ReadDocuments] returns a source's first N documents in file order, for evaluation;
//     [FetchC4] downloads C4's files, resuming interrupted downloads.
//   - A [Tokenizer] maps bytes to token ids and back: [ByteTokenizer] (one token per byte,
//     vocabulary 256, the default), [SentencePiece] (a LLaMA-style tokenizer.model) or
//     [HFTokenizer] (a Hugging Face tokenizer.json with a BPE model: LLaMA-2's with byte
//     fallback, or byte-level as LLaMA-3 and GPT-2 ship it), chosen by [NewTokenizer].
//   - A [Loader] packs the stream into windows of seqLen+1 tokens, visits them in a seeded
//     permutation per epoch and yields [Batch] values of inputs and next-token targets. Its
//     position is a small [LoaderState] that restores exactly, without replaying history.
//
// [Split] holds the tail of a stream out for evaluation.
//
// Everything random here (which files are read, the order of windows) comes from a small
// generator this package owns (SplitMix64), so a seed gives the same data on every platform
// and with every Go release.
package data
