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
//     (text), the "text" field of each JSON line (jsonl, and c4 for allenai/c4's files,
//     gzip or zstd compressed), the "text" column of each row of a Parquet file (parquet,
//     as the Hugging Face Hub publishes datasets; below); or the files are token shards
//     (tokens). Source.TextKey names another field or column, a dotted path ("meta.body")
//     a nested one. Data that is surely not meant (a compressed file read as text, binary
//     data, a Parquet file read as text) is an error naming the file; Source.Log hears of
//     the rest worth knowing (a read cut by MaxBytes, some invalid UTF-8, null Parquet
//     texts skipped).
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
//   - A [Mixture] draws each sequence of a batch from one of several sources by weight
//     (data.sources), each source a Loader of its own stream; the draws are a pure function
//     of the seed and the sequence's index, so its [MixtureState] restores exactly too.
//
// [Split] holds the tail of a stream out for evaluation.
//
// Everything random here (which files are read, the order of windows) comes from a small
// generator this package owns (SplitMix64), so a seed gives the same data on every platform
// and with every Go release.
//
// # Parquet
//
// Parquet files are read with github.com/parquet-go/parquet-go: the maintained successor
// of segmentio/parquet-go, pure Go (so CGO_ENABLED=0 builds keep working), with every codec
// the Hub's files use, and it reads a file through an io.ReaderAt a page at a time. Only
// the text column is read, row group by row group and page by page, so memory holds a page
// or two of it, never a row group or a file. Its type must be BYTE_ARRAY: Arrow's string,
// large_string and binary; invalid UTF-8 in a value is read as U+FFFD (as in a jsonl
// string) with a warning naming the file, row group and row. Snappy, zstd, gzip and
// uncompressed files are tested, from parquet-go and from pyarrow
// (scripts/make_parquet_fixture.py). A file that is not Parquet, is encrypted, truncated or
// has a corrupt footer or page, lacks the text column (the error lists its columns) or
// whose column is not text (named with its type), repeated (a list) or a struct, is an
// error naming the file (and the row group and column of a corrupt page); a panic of the
// library on a corrupt file is turned into that error.
package data
