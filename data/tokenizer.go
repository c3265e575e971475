package data

import (
	"fmt"
	"slices"
	"unicode/utf8"
)

// Tokenizer turns bytes into token ids and back.
//
// Implementations must be deterministic and safe for concurrent use, must not keep the
// slices they are given, and Decode(Encode(text)) must return text.
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

// tokenizerNames lists the names NewTokenizer accepts, for error messages.
const tokenizerNames = `"byte"`

// NewTokenizer returns the tokenizer called name: "byte" (also "", the default) gives a
// ByteTokenizer. SentencePiece and Hugging Face tokenizer.json come in a later version.
func NewTokenizer(name string) (Tokenizer, error) {
	switch name {
	case "", "byte":
		return ByteTokenizer{}, nil
	}
	return nil, fmt.Errorf("data: unknown tokenizer %q: accepted: %s (sentencepiece and tokenizer.json come in a later version)", name, tokenizerNames)
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
