package data

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
)

// HFTokenizer is a Hugging Face tokenizer read from a tokenizer.json file whose model is
// BPE: the kind LLaMA-2, TinyLlama and Mistral ship (characters with byte fallback), and
// byte-level BPE as GPT-2 and LLaMA-3 ship it. It encodes as the tokenizers library does
// with add_special_tokens=false: added tokens are split out of the raw text first, each
// remaining part goes through the normalizer and pre-tokenizer, then BPE merges by rank
// (with ignore_merges, a pre-token that is in the vocabulary is one token). Decode skips
// special tokens and runs the file's decoder.
//
// Supported: normalizer null, Prepend, Replace (string patterns) and Sequence of them;
// pre_tokenizer null, Metaspace, ByteLevel (with GPT-2's regular expression or none), and
// Split by LLaMA-3's or GPT-2's regular expression (behavior Isolated) followed by ByteLevel;
// decoder Replace, ByteFallback, Fuse, Strip, Metaspace, ByteLevel and Sequence of them;
// post_processor null, ByteLevel, TemplateProcessing and Sequence of them (read for the
// BOS and EOS tokens only: Encode adds none); added tokens with normalized, lstrip, rstrip
// and single_word false. Anything else is refused by [LoadHFTokenizer] with an error that
// names it.
type HFTokenizer struct {
	name string

	vocab        map[string]int32
	tokens       []string // by id: added tokens over the model's vocabulary
	special      []bool   // by id: an added token marked special
	merges       map[uint64]hfMerge
	unk          int32 // -1: none
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	byteIDs      [256]int32  // -1 where the vocabulary has no <0xNN>
	byteChar     [0x80]int32 // vocabulary id of the one-byte character c, or -1

	// Byte-level BPE (pre_tokenizer ByteLevel): the vocabulary by the bytes its tokens
	// stand for, and the id of each byte's token (-1: none).
	byteLevel   bool
	rawVocab    map[string]int32
	byteToken   [256]int32
	split       splitKind
	prefixSpace bool       // ByteLevel's add_prefix_space
	cache       *wordCache // ids of pre-tokens that took merges

	added      []hfAdded // sorted longest first
	addedFirst [256]bool

	normalizers []hfStep
	meta        *hfMetaspace // pre-tokenizer
	decoders    []hfStep

	bos, eos   int32
	splitLines bool
}

// hfMerge is what a pair of ids merges into and the merge's rank (lower merges first).
type hfMerge struct {
	rank  int32
	newID int32
}

// hfAdded is an added token matched in the raw text.
type hfAdded struct {
	content string
	id      int32
}

// hfStep is one normalizer or decoder step.
type hfStep struct {
	kind        string // Prepend, Replace, ByteFallback, Fuse, Strip, Metaspace
	from, to    string
	strip       rune
	start, stop int
	meta        hfMetaspace
}

// hfMetaspace is the Metaspace pre-tokenizer or decoder.
type hfMetaspace struct {
	replacement string
	scheme      string // always, first, never
	split       bool
}

// hfJSON is the part of tokenizer.json the tokenizer reads.
type hfJSON struct {
	AddedTokens []struct {
		ID         int32  `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		Normalized bool   `json:"normalized"`
		Special    bool   `json:"special"`
	} `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         *struct {
		Type                    string            `json:"type"`
		Dropout                 *float64          `json:"dropout"`
		UnkToken                *string           `json:"unk_token"`
		ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
		FuseUnk                 bool              `json:"fuse_unk"`
		ByteFallback            bool              `json:"byte_fallback"`
		IgnoreMerges            bool              `json:"ignore_merges"`
		Vocab                   map[string]int32  `json:"vocab"`
		Merges                  []json.RawMessage `json:"merges"`
	} `json:"model"`
}

// hfComponent is any normalizer, pre-tokenizer or decoder object.
type hfComponent struct {
	Type    string `json:"type"`
	Pattern *struct {
		String *string `json:"String"`
		Regex  *string `json:"Regex"`
	} `json:"pattern"`
	Content        string            `json:"content"`
	Prepend        string            `json:"prepend"`
	Start          int               `json:"start"`
	Stop           int               `json:"stop"`
	Replacement    string            `json:"replacement"`
	PrependScheme  string            `json:"prepend_scheme"`
	AddPrefixSpace *bool             `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
	Split          *bool             `json:"split"`
	Behavior       string            `json:"behavior"`
	Invert         bool              `json:"invert"`
	Normalizers    []json.RawMessage `json:"normalizers"`
	PreTokenizers  []json.RawMessage `json:"pretokenizers"`
	Decoders       []json.RawMessage `json:"decoders"`
	Processors     []json.RawMessage `json:"processors"`
	Single         []hfTemplatePiece `json:"single"`
	SpecialTokens  map[string]struct {
		IDs []int32 `json:"ids"`
	} `json:"special_tokens"`
}

// hfTemplatePiece is one element of a TemplateProcessing template: a special token or the
// sequence.
type hfTemplatePiece struct {
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
}

// LoadHFTokenizer reads a Hugging Face tokenizer.json whose model is BPE. BOS and EOS come
// from tokenizer_config.json in the same directory (bos_token, eos_token) when that file
// exists; else BOS is the token the post_processor's TemplateProcessing puts before the
// text and EOS the one it puts after (LLaMA-2 and LLaMA-3 put BOS only); else they are the
// added tokens "<s>" and "</s>", or LLaMA-3's "<|begin_of_text|>" and "<|end_of_text|>".
func LoadHFTokenizer(path string) (*HFTokenizer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("data: tokenizer.json: %w", err)
	}
	t, err := parseHFTokenizer(b)
	if err != nil {
		return nil, fmt.Errorf("data: tokenizer.json %s: %w", path, err)
	}
	t.name = path
	cfg := filepath.Join(filepath.Dir(path), "tokenizer_config.json")
	if err := t.readConfig(cfg); err != nil {
		return nil, fmt.Errorf("data: %s: %w", cfg, err)
	}
	return t, nil
}

func parseHFTokenizer(b []byte) (*HFTokenizer, error) {
	var f hfJSON
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, err
	}
	m := f.Model
	switch {
	case m == nil:
		return nil, errors.New("no model")
	case m.Type != "BPE":
		return nil, fmt.Errorf("model.type %q is not supported: only BPE (as LLaMA-2 and TinyLlama ship)", m.Type)
	case m.Dropout != nil && *m.Dropout != 0:
		return nil, fmt.Errorf("model.dropout = %v is not supported: only null (deterministic encoding)", *m.Dropout)
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "":
		return nil, fmt.Errorf("model.continuing_subword_prefix = %q is not supported: only null", *m.ContinuingSubwordPrefix)
	case m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return nil, fmt.Errorf("model.end_of_word_suffix = %q is not supported: only null", *m.EndOfWordSuffix)
	case len(m.Vocab) == 0:
		return nil, errors.New("model.vocab is empty")
	}
	t := &HFTokenizer{
		vocab:        m.Vocab,
		merges:       make(map[uint64]hfMerge, len(m.Merges)),
		unk:          -1,
		fuseUnk:      m.FuseUnk,
		byteFallback: m.ByteFallback,
		ignoreMerges: m.IgnoreMerges,
		bos:          -1,
		eos:          -1,
	}
	size := 0
	for tok, id := range m.Vocab {
		if id < 0 {
			return nil, fmt.Errorf("model.vocab[%q] = %d is negative", tok, id)
		}
		size = max(size, int(id)+1)
	}
	for _, a := range f.AddedTokens {
		if a.ID < 0 {
			return nil, fmt.Errorf("added token %q has negative id %d", a.Content, a.ID)
		}
		size = max(size, int(a.ID)+1)
	}
	// Ids number the tokens listed: a larger one would make the table far bigger than the
	// file (an id of 2^31 asks for 32 GiB).
	if listed := len(m.Vocab) + len(f.AddedTokens); size > listed {
		return nil, fmt.Errorf("token id %d is past the %d tokens listed in model.vocab and added_tokens: ids must number the tokens from 0", size-1, listed)
	}
	t.tokens = make([]string, size)
	t.special = make([]bool, size)
	for tok, id := range m.Vocab {
		t.tokens[id] = tok
	}
	for i := range t.byteIDs {
		t.byteIDs[i] = -1
		if id, ok := m.Vocab[fmt.Sprintf("<0x%02X>", i)]; ok {
			t.byteIDs[i] = id
		}
	}
	for c := range t.byteChar {
		t.byteChar[c] = -1
		if id, ok := m.Vocab[string(rune(c))]; ok {
			t.byteChar[c] = id
		}
	}
	if m.UnkToken != nil {
		id, ok := m.Vocab[*m.UnkToken]
		if !ok {
			return nil, fmt.Errorf("model.unk_token %q is not in model.vocab", *m.UnkToken)
		}
		t.unk = id
	}
	for i, raw := range m.Merges {
		a, b, err := parseHFMerge(raw)
		if err != nil {
			return nil, fmt.Errorf("model.merges[%d]: %w", i, err)
		}
		ia, oka := m.Vocab[a]
		ib, okb := m.Vocab[b]
		in, okn := m.Vocab[a+b]
		switch {
		case !oka:
			return nil, fmt.Errorf("model.merges[%d]: %q is not in model.vocab", i, a)
		case !okb:
			return nil, fmt.Errorf("model.merges[%d]: %q is not in model.vocab", i, b)
		case !okn:
			return nil, fmt.Errorf("model.merges[%d]: merged token %q is not in model.vocab", i, a+b)
		}
		// As tokenizers builds its merge map, a repeated pair keeps its last rank.
		t.merges[pairKey(ia, ib)] = hfMerge{rank: int32(i), newID: in}
	}
	for i, a := range f.AddedTokens {
		switch {
		case a.Content == "":
			return nil, fmt.Errorf("added_tokens[%d] (id %d) is empty", i, a.ID)
		case a.Normalized || a.LStrip || a.RStrip || a.SingleWord:
			return nil, fmt.Errorf("added token %q: normalized, lstrip, rstrip and single_word must be false (the only kind supported; got %v, %v, %v, %v)",
				a.Content, a.Normalized, a.LStrip, a.RStrip, a.SingleWord)
		}
		t.tokens[a.ID] = a.Content
		t.special[a.ID] = a.Special
		t.added = append(t.added, hfAdded{a.Content, a.ID})
		t.addedFirst[a.Content[0]] = true
	}
	// Longest first, so the first match at a position is the longest.
	slices.SortStableFunc(t.added, func(x, y hfAdded) int { return len(y.content) - len(x.content) })
	var err error
	if t.normalizers, err = parseHFSteps(f.Normalizer, "normalizer", "normalizers"); err != nil {
		return nil, err
	}
	if t.decoders, err = parseHFSteps(f.Decoder, "decoder", "decoders"); err != nil {
		return nil, err
	}
	if err = t.parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if t.byteLevel {
		t.cache = &wordCache{m: make(map[string][]int32)}
		t.rawVocab = make(map[string]int32, len(m.Vocab))
		for tok, id := range m.Vocab {
			if b, ok := byteLevelBytes(tok); ok {
				t.rawVocab[string(b)] = id
			}
		}
		for b, r := range byteChars {
			t.byteToken[b] = -1
			if id, ok := m.Vocab[string(r)]; ok {
				t.byteToken[b] = id
			}
		}
	}
	t.splitLines = !t.byteLevel && t.newlinesIndependent()
	for _, names := range [][2]string{{"<s>", "</s>"}, {"<|begin_of_text|>", "<|end_of_text|>"}} {
		if id, ok := t.addedID(names[0]); ok && t.bos < 0 {
			t.bos = id
		}
		if id, ok := t.addedID(names[1]); ok && t.eos < 0 {
			t.eos = id
		}
	}
	bos, eos, err := parseHFPostProcessor(f.PostProcessor)
	if err != nil {
		return nil, err
	}
	for _, x := range []struct {
		id  int32
		dst *int32
	}{{bos, &t.bos}, {eos, &t.eos}} {
		if x.id >= int32(len(t.tokens)) {
			return nil, fmt.Errorf("post_processor: special token id %d is outside the vocabulary of %d", x.id, len(t.tokens))
		}
		if x.id >= 0 {
			*x.dst = x.id
		}
	}
	return t, nil
}

// parseHFPostProcessor reads a post_processor for the tokens its TemplateProcessing puts
// around a single sequence: bos is the one before it, eos the one after it, -1 for none
// (or for more than one). ByteLevel, which only moves offsets, is accepted and ignored;
// so is everything a Sequence holds besides them.
func parseHFPostProcessor(raw json.RawMessage) (bos, eos int32, err error) {
	bos, eos = -1, -1
	if len(raw) == 0 || string(raw) == "null" {
		return bos, eos, nil
	}
	var c hfComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return bos, eos, fmt.Errorf("post_processor: %w", err)
	}
	switch c.Type {
	case "ByteLevel":
		return bos, eos, nil
	case "Sequence":
		for _, p := range c.Processors {
			b, e, err := parseHFPostProcessor(p)
			if err != nil {
				return bos, eos, err
			}
			bos, eos = max(bos, b), max(eos, e)
		}
		return bos, eos, nil
	case "TemplateProcessing":
		seq := slices.IndexFunc(c.Single, func(p hfTemplatePiece) bool { return p.Sequence != nil })
		if seq < 0 {
			return bos, eos, errors.New("post_processor TemplateProcessing: single has no Sequence")
		}
		id := func(i int) (int32, error) {
			p := c.Single[i].SpecialToken
			if p == nil {
				return -1, fmt.Errorf("post_processor TemplateProcessing: single[%d] is neither a SpecialToken nor a Sequence", i)
			}
			s, ok := c.SpecialTokens[p.ID]
			if !ok || len(s.IDs) != 1 {
				return -1, fmt.Errorf("post_processor TemplateProcessing: special token %q is not in special_tokens with one id", p.ID)
			}
			return s.IDs[0], nil
		}
		if seq == 1 {
			if bos, err = id(0); err != nil {
				return -1, -1, err
			}
		}
		if seq == len(c.Single)-2 {
			if eos, err = id(seq + 1); err != nil {
				return -1, -1, err
			}
		}
		return bos, eos, nil
	}
	return bos, eos, fmt.Errorf("post_processor %s is not supported (supported: null, ByteLevel, TemplateProcessing, Sequence)", c.Type)
}

// newlinesIndependent reports whether a newline never takes part in a merge, so that
// lines can be merged one at a time: its token (the vocabulary's "\n" or the byte token
// <0x0A> with every byte token present, so that no unknown token is fused across it) is in
// no merge pair.
func (t *HFTokenizer) newlinesIndependent() bool {
	if t.ignoreMerges {
		return false
	}
	nl, ok := t.vocab["\n"]
	if !ok {
		if !t.byteFallback || slices.Contains(t.byteIDs[:], -1) {
			return false
		}
		nl = t.byteIDs['\n']
	}
	for k := range t.merges {
		if int32(k>>32) == nl || int32(uint32(k)) == nl {
			return false
		}
	}
	return true
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// parseHFMerge reads a merge in either form: "a b" or ["a", "b"].
func parseHFMerge(raw json.RawMessage) (string, string, error) {
	var s string
	if n := len(raw); n >= 2 && raw[0] == '"' && raw[n-1] == '"' && bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		s = string(raw[1 : n-1]) // no escapes: the string is the text between the quotes
	} else if err := json.Unmarshal(raw, &s); err != nil {
		s = ""
	}
	if s != "" {
		a, b, ok := strings.Cut(s, " ")
		if !ok || strings.Contains(b, " ") {
			return "", "", fmt.Errorf("%q is not two tokens separated by one space", s)
		}
		return a, b, nil
	}
	var p []string
	if err := json.Unmarshal(raw, &p); err != nil || len(p) != 2 {
		return "", "", fmt.Errorf("%s is neither \"a b\" nor [\"a\", \"b\"]", raw)
	}
	return p[0], p[1], nil
}

// parseHFSteps reads a normalizer or decoder (what says which) into a flat list of steps.
func parseHFSteps(raw json.RawMessage, what, list string) ([]hfStep, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var c hfComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	supported := "Sequence, Prepend, Replace"
	if what == "decoder" {
		supported = "Sequence, Replace, ByteFallback, Fuse, Strip, Metaspace, ByteLevel"
	}
	bad := func(why string) error {
		return fmt.Errorf("%s %s %s (supported: %s)", what, c.Type, why, supported)
	}
	switch c.Type {
	case "Sequence":
		children := c.Normalizers
		if what == "decoder" {
			children = c.Decoders
		}
		var steps []hfStep
		for _, r := range children {
			s, err := parseHFSteps(r, what, list)
			if err != nil {
				return nil, err
			}
			steps = append(steps, s...)
		}
		return steps, nil
	case "Replace":
		if c.Pattern == nil || c.Pattern.String == nil {
			return nil, bad("with a regular expression is not supported, only a String pattern")
		}
		if *c.Pattern.String == "" {
			return nil, bad("with an empty pattern is not supported")
		}
		return []hfStep{{kind: c.Type, from: *c.Pattern.String, to: c.Content}}, nil
	case "Prepend":
		if what == "normalizer" {
			return []hfStep{{kind: c.Type, to: c.Prepend}}, nil
		}
	case "ByteFallback", "Fuse", "ByteLevel":
		if what == "decoder" {
			return []hfStep{{kind: c.Type}}, nil
		}
	case "Strip":
		if what == "decoder" {
			r, n := utf8.DecodeRuneInString(c.Content)
			if n == 0 || n != len(c.Content) {
				return nil, bad(fmt.Sprintf("content %q is not one character", c.Content))
			}
			return []hfStep{{kind: c.Type, strip: r, start: c.Start, stop: c.Stop}}, nil
		}
	case "Metaspace":
		if what == "decoder" {
			m, err := parseHFMetaspace(c)
			if err != nil {
				return nil, fmt.Errorf("decoder Metaspace: %w", err)
			}
			return []hfStep{{kind: c.Type, meta: m}}, nil
		}
	}
	return nil, bad("is not supported")
}

// parsePreTokenizer reads a pre_tokenizer: null; Metaspace; ByteLevel; or a Sequence of
// Split (LLaMA-3's or GPT-2's regular expression, behavior Isolated, not inverted) and
// ByteLevel (without its regular expression or prefix space), in that order, as LLaMA-3
// ships. A Sequence of one is read as its element.
func (t *HFTokenizer) parsePreTokenizer(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	const supported = "(supported: null, Metaspace, ByteLevel, Sequence [Split, ByteLevel])"
	var c hfComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("pre_tokenizer: %w", err)
	}
	switch {
	case c.Type == "Sequence" && len(c.PreTokenizers) == 1:
		return t.parsePreTokenizer(c.PreTokenizers[0])
	case c.Type == "Metaspace":
		m, err := parseHFMetaspace(c)
		if err != nil {
			return fmt.Errorf("pre_tokenizer Metaspace: %w", err)
		}
		t.meta = &m
		return nil
	case c.Type == "ByteLevel":
		return t.parseByteLevel(c, splitGPT2)
	case c.Type == "Sequence" && len(c.PreTokenizers) == 2:
		var split, bl hfComponent
		if err := json.Unmarshal(c.PreTokenizers[0], &split); err != nil {
			return fmt.Errorf("pre_tokenizer.pretokenizers[0]: %w", err)
		}
		if err := json.Unmarshal(c.PreTokenizers[1], &bl); err != nil {
			return fmt.Errorf("pre_tokenizer.pretokenizers[1]: %w", err)
		}
		if split.Type != "Split" || bl.Type != "ByteLevel" {
			return fmt.Errorf("pre_tokenizer Sequence [%s, %s] is not supported %s", split.Type, bl.Type, supported)
		}
		kind, err := parseHFSplit(split)
		if err != nil {
			return fmt.Errorf("pre_tokenizer.pretokenizers[0]: %w", err)
		}
		if bl.UseRegex == nil || *bl.UseRegex || bl.AddPrefixSpace != nil && *bl.AddPrefixSpace {
			return errors.New("pre_tokenizer.pretokenizers[1]: ByteLevel after Split must have use_regex false and add_prefix_space false")
		}
		return t.parseByteLevel(bl, kind)
	}
	return fmt.Errorf("pre_tokenizer %s is not supported %s", c.Type, supported)
}

// parseByteLevel reads a ByteLevel pre-tokenizer; split is what it splits the text with
// when its use_regex is true (the default) or absent.
func (t *HFTokenizer) parseByteLevel(c hfComponent, split splitKind) error {
	t.byteLevel = true
	t.split = split
	if c.UseRegex != nil && !*c.UseRegex && split == splitGPT2 {
		t.split = splitNone
	}
	t.prefixSpace = c.AddPrefixSpace == nil || *c.AddPrefixSpace
	return nil
}

// parseHFSplit reads a Split pre-tokenizer whose pattern is one of the regular
// expressions implemented here.
func parseHFSplit(c hfComponent) (splitKind, error) {
	if c.Pattern == nil || c.Pattern.Regex == nil {
		return 0, errors.New("Split: only a Regex pattern is supported")
	}
	if c.Behavior != "Isolated" || c.Invert {
		return 0, fmt.Errorf("Split: behavior %q, invert %v is not supported (only Isolated, false)", c.Behavior, c.Invert)
	}
	switch *c.Pattern.Regex {
	case llama3Pattern:
		return splitLlama3, nil
	case gpt2Pattern:
		return splitGPT2, nil
	}
	return 0, fmt.Errorf("Split: regular expression %q is not supported (only LLaMA-3's %q and GPT-2's %q)",
		*c.Pattern.Regex, llama3Pattern, gpt2Pattern)
}

func parseHFMetaspace(c hfComponent) (hfMetaspace, error) {
	m := hfMetaspace{replacement: c.Replacement, scheme: c.PrependScheme, split: c.Split == nil || *c.Split}
	if utf8.RuneCountInString(m.replacement) != 1 {
		return m, fmt.Errorf("replacement %q is not one character", m.replacement)
	}
	if m.scheme == "" { // files from before prepend_scheme
		m.scheme = "never"
		if c.AddPrefixSpace == nil || *c.AddPrefixSpace {
			m.scheme = "always"
		}
	}
	switch m.scheme {
	case "always", "first", "never":
		return m, nil
	}
	return m, fmt.Errorf("prepend_scheme %q is not one of always, first, never", m.scheme)
}

// readConfig takes BOS and EOS from tokenizer_config.json, if the file exists.
func (t *HFTokenizer) readConfig(path string) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(b, &cfg); err != nil {
		return err
	}
	for key, dst := range map[string]*int32{"bos_token": &t.bos, "eos_token": &t.eos} {
		raw, ok := cfg[key]
		if !ok {
			continue
		}
		var s string
		var obj struct {
			Content string `json:"content"`
		}
		switch {
		case string(raw) == "null":
			*dst = -1
			continue
		case json.Unmarshal(raw, &s) == nil:
		case json.Unmarshal(raw, &obj) == nil && obj.Content != "":
			s = obj.Content
		default:
			return fmt.Errorf("%s = %s: want a string or {\"content\": ...}", key, raw)
		}
		id, ok := t.addedID(s)
		if !ok {
			return fmt.Errorf("%s = %q is not a token of %s", key, s, t.name)
		}
		*dst = id
	}
	return nil
}

// addedID is the id of token s: an added token, else one of the vocabulary.
func (t *HFTokenizer) addedID(s string) (int32, bool) {
	for _, a := range t.added {
		if a.content == s {
			return a.id, true
		}
	}
	id, ok := t.vocab[s]
	return id, ok
}

// Name returns the path the tokenizer was loaded from.
func (t *HFTokenizer) Name() string { return t.name }

// VocabSize is one more than the largest id of the vocabulary and the added tokens.
func (t *HFTokenizer) VocabSize() int { return len(t.tokens) }

// Specials returns the ids of BOS and EOS, -1 for one the tokenizer does not have.
func (t *HFTokenizer) Specials() (bos, eos int32) { return t.bos, t.eos }

// Piece returns the token of id, or "" if id is out of range.
func (t *HFTokenizer) Piece(id int32) string {
	if id < 0 || int(id) >= len(t.tokens) {
		return ""
	}
	return t.tokens[id]
}

// Encode returns the ids of text, without BOS or EOS (add_special_tokens=false). Text that
// is not valid UTF-8 is read with U+FFFD for each malformed byte.
func (t *HFTokenizer) Encode(text []byte) []int32 {
	return t.AppendEncode(make([]int32, 0, len(text)/4+1), text) // LLaMA-3: 3 to 4 bytes a token on text
}

// AppendEncode appends the ids of text to dst and returns the extended slice.
func (t *HFTokenizer) AppendEncode(dst []int32, text []byte) []int32 {
	if !utf8.Valid(text) {
		text = validUTF8(text)
	}
	var w bpeWork
	start := 0
	for i := 0; i < len(text); {
		if !t.addedFirst[text[i]] {
			i++
			continue
		}
		a, ok := t.matchAdded(text[i:])
		if !ok {
			i++
			continue
		}
		dst = t.encodeSplit(dst, text[start:i], start == 0, &w)
		dst = append(dst, a.id)
		i += len(a.content)
		start = i
	}
	return t.encodeSplit(dst, text[start:], start == 0, &w)
}

// matchAdded returns the longest added token s starts with.
func (t *HFTokenizer) matchAdded(s []byte) (hfAdded, bool) {
	for _, a := range t.added {
		if bytes.HasPrefix(s, []byte(a.content)) {
			return a, true
		}
	}
	return hfAdded{}, false
}

// validUTF8 replaces each byte of b that is not part of a valid UTF-8 sequence with U+FFFD.
func validUTF8(b []byte) []byte {
	out := make([]byte, 0, len(b)+8)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n <= 1 {
			out = append(out, replacementChar...)
			n = 1
		} else {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return out
}

// encodeSplit normalizes, pre-tokenizes and BPE-encodes one part of the text between added
// tokens; atStart says whether it begins the text (Metaspace's prepend_scheme "first").
func (t *HFTokenizer) encodeSplit(dst []int32, part []byte, atStart bool, w *bpeWork) []int32 {
	if len(part) == 0 {
		return dst
	}
	if t.byteLevel && t.normalizers == nil && !t.prefixSpace {
		return t.encodeByteLevel(dst, part, w) // LLaMA-3: no copy of the text
	}
	s := string(part)
	for _, n := range t.normalizers {
		switch n.kind {
		case "Prepend":
			if s != "" {
				s = n.to + s
			}
		case "Replace":
			s = strings.ReplaceAll(s, n.from, n.to)
		}
	}
	if s == "" {
		return dst
	}
	if t.byteLevel {
		if t.prefixSpace && s[0] != ' ' {
			s = " " + s
		}
		return t.encodeByteLevel(dst, []byte(s), w)
	}
	if m := t.meta; m != nil {
		s = strings.ReplaceAll(s, " ", m.replacement)
		if (m.scheme == "always" || m.scheme == "first" && atStart) && !strings.HasPrefix(s, m.replacement) {
			s = m.replacement + s
		}
		if m.split {
			// Split before each replacement character (it starts the next word).
			for s != "" {
				i := strings.Index(s[1:], m.replacement)
				if i < 0 {
					break
				}
				dst = t.encodeWord(dst, s[:i+1], w)
				s = s[i+1:]
			}
		}
	}
	if t.splitLines {
		splitLines(s, true, func(start, end int) { dst = t.encodeWord(dst, s[start:end], w) })
		return dst
	}
	return t.encodeWord(dst, s, w)
}

// encodeByteLevel splits text with the pre-tokenizer's regular expression and encodes
// each piece with byte-level BPE.
func (t *HFTokenizer) encodeByteLevel(dst []int32, text []byte, w *bpeWork) []int32 {
	word := func(start, end int) { dst = t.encodeBytes(dst, text[start:end], w) }
	switch t.split {
	case splitLlama3:
		scanLlama3(text, word)
	case splitGPT2:
		scanGPT2(text, word)
	default:
		word(0, len(text))
	}
	return dst
}

// encodeBytes is tokenizers' BPE on one pre-token of a byte-level tokenizer: with
// ignore_merges, the pre-token's own id if the vocabulary has it; else a symbol per byte
// (bytes without a token become the unknown token, or nothing if there is none), merged by
// rank.
func (t *HFTokenizer) encodeBytes(dst []int32, word []byte, w *bpeWork) []int32 {
	if len(word) == 0 {
		return dst
	}
	if t.ignoreMerges {
		if id, ok := t.rawVocab[string(word)]; ok {
			return append(dst, id)
		}
	}
	if ids, ok := t.cache.get(word); ok {
		return append(dst, ids...)
	}
	w.reset()
	unk := false
	for i, b := range word {
		switch id := t.byteToken[b]; {
		case id >= 0:
			w.add(i, i+1, id, false)
			unk = false
		case t.unk >= 0 && !(unk && t.fuseUnk):
			w.add(i, i+1, t.unk, false)
			unk = true
		case t.unk >= 0: // fused into the unknown token before it
			w.syms[len(w.syms)-1].end = int32(i + 1)
		}
	}
	n := len(dst)
	dst = t.mergeAppend(dst, w)
	t.cache.put(word, dst[n:])
	return dst
}

// wordCache holds the ids of pre-tokens that BPE merged, as tokenizers' BPE cache does, so
// that a word seen again (an identifier in code, a rare name) costs a map lookup. It holds
// words of at most wordCacheLen bytes and stops growing at wordCacheSize entries. Encoders
// running at once share it: a lookup or an insertion that would wait for the lock is
// skipped instead.
type wordCache struct {
	mu sync.RWMutex
	m  map[string][]int32
}

const (
	wordCacheSize = 1 << 16
	wordCacheLen  = 256
)

// get returns the cached ids of word.
func (c *wordCache) get(word []byte) ([]int32, bool) {
	if len(word) > wordCacheLen || !c.mu.TryRLock() {
		return nil, false
	}
	ids, ok := c.m[string(word)]
	c.mu.RUnlock()
	return ids, ok
}

// put caches a copy of ids as the ids of word, if there is room.
func (c *wordCache) put(word []byte, ids []int32) {
	if len(word) > wordCacheLen || !c.mu.TryLock() {
		return
	}
	if len(c.m) < wordCacheSize {
		c.m[string(word)] = slices.Clone(ids)
	}
	c.mu.Unlock()
}

// encodeWord is tokenizers' BPE on one word: a symbol per character (or its byte tokens,
// or a fused unknown token), then merges by lowest rank, leftmost first.
func (t *HFTokenizer) encodeWord(dst []int32, word string, w *bpeWork) []int32 {
	if word == "" {
		return dst
	}
	if t.ignoreMerges {
		if id, ok := t.vocab[word]; ok {
			return append(dst, id)
		}
	}
	w.reset()
	unkStart, unkEnd := -1, -1
	flushUnk := func() {
		if unkStart >= 0 {
			w.add(unkStart, unkEnd, t.unk, false)
			unkStart = -1
		}
	}
	for i := 0; i < len(word); {
		if b := word[i]; b < 0x80 && t.byteChar[b] >= 0 {
			flushUnk()
			w.add(i, i+1, t.byteChar[b], false)
			i++
			continue
		}
		_, n := utf8.DecodeRuneInString(word[i:])
		c := word[i : i+n]
		if id, ok := t.vocab[c]; ok {
			flushUnk()
			w.add(i, i+n, id, false)
		} else if t.byteFallback && t.hasBytes(c) {
			flushUnk()
			for k := 0; k < n; k++ {
				w.add(i+k, i+k+1, t.byteIDs[c[k]], false)
			}
		} else if t.unk >= 0 {
			if unkStart >= 0 && !t.fuseUnk {
				flushUnk()
			}
			if unkStart < 0 {
				unkStart = i
			}
			unkEnd = i + n
		}
		i += n
	}
	flushUnk()
	return t.mergeAppend(dst, w)
}

// mergeAppend merges the symbols of w by rank, lowest first and leftmost on a tie, as
// tokenizers' BPE does, and appends their ids to dst.
func (t *HFTokenizer) mergeAppend(dst []int32, w *bpeWork) []int32 {
	if len(w.syms) == 0 {
		return dst
	}
	try := func(l, r int32) {
		if l < 0 || r < 0 {
			return
		}
		if m, ok := t.merges[pairKey(w.syms[l].id, w.syms[r].id)]; ok {
			w.queue.push(bpeCand{prio: -float64(m.rank), left: l, right: r, aux: m.newID})
		}
	}
	for i := int32(1); i < int32(len(w.syms)); i++ {
		try(i-1, i)
	}
	for len(w.queue) > 0 {
		c := w.queue.pop()
		a := w.syms[c.left]
		if a.start == a.end || a.next < 0 {
			continue
		}
		// tokenizers' staleness test: the pair there now must still merge into this id.
		if m, ok := t.merges[pairKey(a.id, w.syms[a.next].id)]; !ok || m.newID != c.aux {
			continue
		}
		w.merge(c.left, a.next)
		w.syms[c.left].id = c.aux
		try(w.syms[c.left].prev, c.left)
		try(c.left, w.syms[c.left].next)
	}
	for i := int32(0); i >= 0; i = w.syms[i].next {
		dst = append(dst, w.syms[i].id)
	}
	return dst
}

// hasBytes reports whether every byte of c has a byte token.
func (t *HFTokenizer) hasBytes(c string) bool {
	for i := 0; i < len(c); i++ {
		if t.byteIDs[c[i]] < 0 {
			return false
		}
	}
	return true
}

// Decode returns the text of ids as tokenizers decodes it with skip_special_tokens=true:
// special added tokens are dropped, the others become their tokens and pass through the
// decoder (without one, tokens are joined by spaces). An id outside the vocabulary decodes
// to U+FFFD (tokenizers drops it).
func (t *HFTokenizer) Decode(ids []int32) []byte {
	toks := make([]string, 0, len(ids))
	for _, id := range ids {
		switch {
		case id < 0 || int(id) >= len(t.tokens):
			toks = append(toks, "\uFFFD")
		case !t.special[id]:
			toks = append(toks, t.tokens[id])
		}
	}
	if t.decoders == nil {
		return []byte(strings.Join(toks, " "))
	}
	for _, d := range t.decoders {
		toks = d.decode(toks)
	}
	return []byte(strings.Join(toks, ""))
}

// decode applies one decoder step to the tokens, as tokenizers' decode_chain.
func (d hfStep) decode(toks []string) []string {
	switch d.kind {
	case "Replace":
		for i, s := range toks {
			toks[i] = strings.ReplaceAll(s, d.from, d.to)
		}
	case "Fuse":
		return []string{strings.Join(toks, "")}
	case "ByteLevel":
		// The bytes the tokens stand for, read as UTF-8 the way Rust's from_utf8_lossy
		// does; a token with a character that stands for no byte stays as it is.
		var raw []byte
		for _, s := range toks {
			if b, ok := byteLevelBytes(s); ok {
				raw = append(raw, b...)
			} else {
				raw = append(raw, s...)
			}
		}
		return []string{string(appendLossyUTF8(nil, raw))}
	case "Strip":
		for i, s := range toks {
			r := []rune(s)
			a := 0
			for a < d.start && a < len(r) && r[a] == d.strip {
				a++
			}
			b := len(r)
			for len(r)-b < d.stop && b > a && r[b-1] == d.strip {
				b--
			}
			toks[i] = string(r[a:b])
		}
	case "Metaspace":
		repl, _ := utf8.DecodeRuneInString(d.meta.replacement)
		for i, s := range toks {
			drop := i == 0 && d.meta.scheme != "never"
			toks[i] = strings.Map(func(r rune) rune {
				switch {
				case r != repl:
					return r
				case drop:
					return -1
				}
				return ' '
			}, s)
		}
	case "ByteFallback":
		var out []string
		var run []byte
		flush := func() {
			if len(run) == 0 {
				return
			}
			if utf8.Valid(run) {
				out = append(out, string(run))
			} else {
				for range run {
					out = append(out, "\uFFFD")
				}
			}
			run = run[:0]
		}
		for _, s := range toks {
			if v, ok := pieceByte(s); ok {
				run = append(run, v)
				continue
			}
			flush()
			out = append(out, s)
		}
		flush()
		return out
	}
	return toks
}

func (t *HFTokenizer) setName(n string) { t.name = n }
