package data

import (
	"unicode"
	"unicode/utf8"
)

// This file holds what byte-level BPE (GPT-2, LLaMA-3) needs beyond the BPE in
// hftokenizer.go: GPT-2's map between bytes and the characters its vocabulary spells them
// with, the two regular expressions such tokenizers split text with (written out as
// scanners: Go's regexp has no lookahead), and Rust's lossy UTF-8 decoding, which the
// ByteLevel decoder ends with.

// The patterns of the Split pre-tokenizer (and of ByteLevel with use_regex) that
// [LoadHFTokenizer] implements; a tokenizer.json with any other is refused.
const (
	// llama3Pattern is LLaMA-3's (and tiktoken's cl100k_base): contractions in any case,
	// a word with at most one leading non-letter, digits in groups of at most three,
	// punctuation with a leading space and trailing newlines, newline runs with the
	// whitespace before them, and whitespace runs that leave their last character to the
	// next word.
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// gpt2Pattern is GPT-2's, the one ByteLevel uses with use_regex true.
	gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

// splitKind says which pattern a byte-level tokenizer splits text with.
type splitKind uint8

const (
	splitNone splitKind = iota
	splitLlama3
	splitGPT2
)

// byteChars is GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the
// other 68 bytes for U+0100 onwards, in byte order.
var byteChars = func() (m [256]rune) {
	n := rune(0)
	for b := range 256 {
		switch {
		case b >= '!' && b <= '~', b >= 0xA1 && b <= 0xAC, b >= 0xAE && b <= 0xFF:
			m[b] = rune(b)
		default:
			m[b] = 0x100 + n
			n++
		}
	}
	return m
}()

// charBytes is byteChars inverted: the byte a character of a byte-level token stands for,
// -1 for a character that stands for none. byteChars maps into [0, 0x144).
var charBytes = func() (m [0x144]int16) {
	for i := range m {
		m[i] = -1
	}
	for b, r := range byteChars {
		m[r] = int16(b)
	}
	return m
}()

// byteLevelBytes returns the bytes a byte-level token stands for, or ok false if one of
// its characters stands for none.
func byteLevelBytes(tok string) (b []byte, ok bool) {
	b = make([]byte, 0, len(tok))
	for _, r := range tok {
		if r >= rune(len(charBytes)) || charBytes[r] < 0 {
			return nil, false
		}
		b = append(b, byte(charBytes[r]))
	}
	return b, true
}

// Character classes of the patterns: \p{L}, \p{N}, \s, and the rest.
const (
	clsOther = iota
	clsLetter
	clsNumber
	clsSpace
)

// asciiClass is the class of each ASCII character.
var asciiClass = func() (c [0x80]uint8) {
	for r := range rune(0x80) {
		c[r] = classOf(r)
	}
	return c
}()

// classOf is the class of r. Oniguruma's \s (what tokenizers uses) is U+0009 to U+000D,
// U+0085 and the separators Zs, Zl and Zp: the same set as unicode.IsSpace.
func classOf(r rune) uint8 {
	switch {
	case unicode.IsLetter(r):
		return clsLetter
	case unicode.IsNumber(r):
		return clsNumber
	case unicode.IsSpace(r):
		return clsSpace
	}
	return clsOther
}

// runeAt decodes the rune at s[i:] and its class; at the end of s it returns width 0 and
// class -1. A byte that is not valid UTF-8 reads as one U+FFFD, of class other.
func runeAt(s []byte, i int) (r rune, n int, class int) {
	if i >= len(s) {
		return 0, 0, -1
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1, int(asciiClass[c])
	}
	r, n = utf8.DecodeRune(s[i:])
	return r, n, int(classOf(r))
}

// skipClass returns the end of the run of characters of class c that starts at i.
func skipClass(s []byte, i, c int) int {
	for {
		_, n, k := runeAt(s, i)
		if k != c {
			return i
		}
		i += n
	}
}

// contraction returns the length of the contraction ('s, 't, 're, 've, 'm, 'll, 'd) at
// s[i:], which starts with an apostrophe, or 0. With fold, letters match in any case, as
// Oniguruma's (?i) has them: "s" also matches U+017F, the long s, whose case fold is "s".
func contraction(s []byte, i int, fold bool) int {
	letter := func(j int, want byte) (int, bool) {
		r, n, _ := runeAt(s, j)
		switch {
		case n == 0:
			return 0, false
		case r == rune(want):
			return n, true
		case !fold:
			return 0, false
		case r == rune(want-'a'+'A'):
			return n, true
		case want == 's' && r == 0x17F:
			return n, true
		}
		return 0, false
	}
	j := i + 1
	for _, c := range []string{"s", "t", "re", "ve", "m", "ll", "d"} {
		k := j
		ok := true
		for x := 0; x < len(c) && ok; x++ {
			var n int
			n, ok = letter(k, c[x])
			k += n
		}
		if ok {
			return k - i
		}
	}
	return 0
}

// scanLlama3 calls f with the byte span of each match of llama3Pattern in s, in order.
// The matches cover s: every character starts one of the alternatives.
func scanLlama3(s []byte, f func(start, end int)) {
	for i := 0; i < len(s); {
		end := llama3Match(s, i)
		f(i, end)
		i = end
	}
}

// llama3Match returns the end of llama3Pattern's match at s[i:], trying its alternatives
// in order as a backtracking matcher does.
func llama3Match(s []byte, i int) int {
	r, n, c := runeAt(s, i)
	if r == '\'' {
		if k := contraction(s, i, true); k > 0 {
			return i + k
		}
	}
	_, n2, c2 := runeAt(s, i+n)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c == clsLetter {
		return skipClass(s, i+n, clsLetter)
	}
	if r != '\r' && r != '\n' && c != clsNumber && c2 == clsLetter {
		return skipClass(s, i+n+n2, clsLetter)
	}
	// \p{N}{1,3}
	if c == clsNumber {
		j := i + n
		for k := 1; k < 3; k++ {
			_, m, cm := runeAt(s, j)
			if cm != clsNumber {
				break
			}
			j += m
		}
		return j
	}
	// ?[^\s\p{L}\p{N}]+[\r\n]*
	if c == clsOther || r == ' ' && c2 == clsOther {
		j := i
		if r == ' ' {
			j += n
		}
		j = skipClass(s, j, clsOther)
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	return spaceMatch(s, i, true)
}

// spaceMatch returns the end of the match at s[i:], which starts a whitespace run, of
// \s*[\r\n]+ (when newlines is set), then \s+(?!\S), then \s+.
func spaceMatch(s []byte, i int, newlines bool) int {
	j, last, lastNL := i, -1, -1
	for {
		r, n, c := runeAt(s, j)
		if c != clsSpace {
			break
		}
		if r == '\r' || r == '\n' {
			lastNL = j
		}
		last = j
		j += n
	}
	switch {
	case newlines && lastNL >= 0:
		// \s* backs off to the last newline, [\r\n]+ takes it (the character after it,
		// if any, is not a newline).
		return lastNL + 1
	case j == len(s) || last == i:
		// \s+(?!\S) at the end of the text, or \s+ for a single whitespace character.
		return j
	}
	// \s+(?!\S): the run but its last character, which goes to the next match.
	return last
}

// scanGPT2 calls f with the byte span of each match of gpt2Pattern in s, in order.
func scanGPT2(s []byte, f func(start, end int)) {
	for i := 0; i < len(s); {
		end := gpt2Match(s, i)
		f(i, end)
		i = end
	}
}

// gpt2Match returns the end of gpt2Pattern's match at s[i:].
func gpt2Match(s []byte, i int) int {
	r, n, c := runeAt(s, i)
	if r == '\'' {
		if k := contraction(s, i, false); k > 0 {
			return i + k
		}
	}
	// ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+'
	if c != clsSpace {
		return skipClass(s, i+n, c)
	}
	if _, n2, c2 := runeAt(s, i+n); r == ' ' && n2 > 0 && c2 != clsSpace {
		return skipClass(s, i+n+n2, c2)
	}
	return spaceMatch(s, i, false)
}

// appendLossyUTF8 appends b to dst as Rust's String::from_utf8_lossy reads it: each
// maximal prefix of a valid UTF-8 sequence that is cut short, and each byte that starts
// none, becomes one U+FFFD.
func appendLossyUTF8(dst, b []byte) []byte {
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		if r, n := utf8.DecodeRune(b[i:]); r != utf8.RuneError || n > 1 {
			dst = append(dst, b[i:i+n]...)
			i += n
			continue
		}
		// Invalid here: skip the longest prefix of a well-formed sequence (Unicode
		// Table 3-7) that starts at i, at least one byte.
		need, lo, hi := 0, byte(0x80), byte(0xBF)
		switch {
		case c >= 0xC2 && c <= 0xDF:
			need = 1
		case c == 0xE0:
			need, lo = 2, 0xA0
		case c == 0xED:
			need, hi = 2, 0x9F
		case c >= 0xE1 && c <= 0xEF:
			need = 2
		case c == 0xF0:
			need, lo = 3, 0x90
		case c == 0xF4:
			need, hi = 3, 0x8F
		case c >= 0xF1 && c <= 0xF3:
			need = 3
		}
		j := i + 1
		for k := 0; k < need && j < len(b) && b[j] >= lo && b[j] <= hi; k++ {
			j++
			lo, hi = 0x80, 0xBF
		}
		dst = append(dst, replacementChar...)
		i = j
	}
	return dst
}
