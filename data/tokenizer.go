package data

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"unicode/utf8"
)

// Tokenizer turns bytes into token ids and back.
//
// Implementations must be deterministic and safe for concurrent use, must not keep the
// slices they are given, and Decode(Encode(text)) must return text for any text the
// tokenizer represents exactly: for ByteTokenizer any bytes; for a SentencePiece or
// tokenizer.json with LLaMA's settings, valid UTF-8 that holds neither U+2581 ("▁", which
// stands for a space) nor the text of an added token such as "<s>" (tokenizer.json only);
// for a byte-level tokenizer.json (LLaMA-3), valid UTF-8 without the text of a special
// token such as "<|begin_of_text|>".
type Tokenizer interface {
	// Encode returns the token ids of text.
	Encode(text []byte) []int32
	// Decode returns the bytes the ids stand for.
	Decode(ids []int32) []byte
	// VocabSize is one more than the largest id Encode returns; the model's vocabulary
	// must be at least this large.
	VocabSize() int
	// Name is the name NewTokenizer knows the tokenizer by.
	Name() string
}

// SpecialTokens is implemented by tokenizers that have beginning- and end-of-sequence
// tokens ([SentencePiece], [HFTokenizer]); an id is -1 where the tokenizer has none.
// Encode never adds them (Hugging Face's add_special_tokens=false): LLaMA-style evaluation
// prepends BOS itself, and Hugging Face's encoding with add_special_tokens=true is BOS
// followed by Encode's ids for LLaMA-2 and LLaMA-3 (their post-processor template).
type SpecialTokens interface {
	Specials() (bos, eos int32)
}

// tokenizerNames lists the names NewTokenizer accepts, for error messages.
const tokenizerNames = `"byte", or the path of a SentencePiece tokenizer.model, a Hugging Face tokenizer.json, or a directory holding one`

// NewTokenizer returns the tokenizer called name: "byte" (also "", the default) gives a
// ByteTokenizer; anything else is a path (expanded by [ExpandPath]) to a SentencePiece
// model ([LoadSentencePiece]) or a Hugging Face tokenizer.json ([LoadHFTokenizer]), told
// apart by content (JSON or not), or to a directory holding tokenizer.json or
// tokenizer.model (tokenizer.json first, as transformers prefers it). The tokenizer's Name
// is the path as given.
func NewTokenizer(name string) (Tokenizer, error) {
	switch name {
	case "", "byte":
		return ByteTokenizer{}, nil
	}
	path, err := ExpandPath(name)
	if err != nil {
		return nil, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("data: unknown tokenizer %q: accepted: %s: %w", name, tokenizerNames, err)
	}
	if st.IsDir() {
		found := ""
		for _, f := range []string{"tokenizer.json", "tokenizer.model"} {
			if _, err := os.Stat(filepath.Join(path, f)); err == nil {
				found = filepath.Join(path, f)
				break
			}
		}
		if found == "" {
			return nil, fmt.Errorf("data: tokenizer %q: directory %s holds neither tokenizer.json nor tokenizer.model", name, path)
		}
		path = found
	}
	head := make([]byte, 64)
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: tokenizer %q: %w", name, err)
	}
	n, _ := io.ReadFull(f, head)
	f.Close()
	var tok interface {
		Tokenizer
		setName(string)
	}
	if t := bytes.TrimLeft(head[:n], " \t\r\n"); len(t) > 0 && t[0] == '{' {
		tok, err = LoadHFTokenizer(path)
	} else if isTiktoken(head[:n]) {
		return nil, fmt.Errorf("data: tokenizer %q: %s is a tiktoken BPE file (lines of base64 token and rank, as Meta's original LLaMA-3 tokenizer.model), which is not supported: use the tokenizer.json of the Hugging Face release", name, path)
	} else {
		tok, err = LoadSentencePiece(path)
	}
	if err != nil {
		return nil, err
	}
	tok.setName(name)
	return tok, nil
}

// isTiktoken reports whether head, the start of a file, is a line of tiktoken's BPE format:
// a token in base64, a space and its rank.
func isTiktoken(head []byte) bool {
	line, _, ok := bytes.Cut(head, []byte("\n"))
	if !ok {
		return false
	}
	tok, rank, ok := bytes.Cut(line, []byte(" "))
	if !ok || len(tok) == 0 || len(rank) == 0 {
		return false
	}
	for _, c := range tok {
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '+' || c == '/' || c == '=') {
			return false
		}
	}
	for _, c := range rank {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// ByteTokenizer is the tokenizer with one token per byte: the id of a byte is its value, so
// the vocabulary is 256 and any byte string, valid UTF-8 or not, round-trips.
type ByteTokenizer struct{}

// Encode returns one id per byte of text, equal to the byte's value.
func (ByteTokenizer) Encode(text []byte) []int32 {
	return ByteTokenizer{}.AppendEncode(make([]int32, 0, len(text)), text)
}

// AppendEncode appends the ids of text to dst and returns the extended slice; it is Encode
// without the allocation, for callers that build one long stream.
func (ByteTokenizer) AppendEncode(dst []int32, text []byte) []int32 {
	n := len(dst)
	dst = slices.Grow(dst, len(text))[:n+len(text)]
	for i, b := range text {
		dst[n+i] = int32(b)
	}
	return dst
}

// Decode returns the byte of each id. An id outside [0, 256), which a model with a larger
// vocabulary can produce, decodes to the UTF-8 encoding of U+FFFD, the replacement character.
func (ByteTokenizer) Decode(ids []int32) []byte {
	out := make([]byte, 0, len(ids))
	for _, id := range ids {
		if id < 0 || id > 255 {
			out = utf8.AppendRune(out, utf8.RuneError)
			continue
		}
		out = append(out, byte(id))
	}
	return out
}

// VocabSize returns 256.
func (ByteTokenizer) VocabSize() int { return 256 }

// Name returns "byte".
func (ByteTokenizer) Name() string { return "byte" }
