package data

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"unicode/utf8"
)

// SentencePiece is a SentencePiece BPE tokenizer read from a tokenizer.model file, the
// format LLaMA, LLaMA-2 and TinyLlama ship. It encodes and decodes as Google's
// sentencepiece library does: the model's normalizer (its precompiled character map, if
// any; optional removal of extra whitespace; a dummy-prefix space; spaces escaped as U+2581
// "▁"), BPE by highest piece score, user-defined symbols kept whole, unused pieces split
// back, unknown characters as <0xNN> byte pieces (byte fallback) or one <unk> per run, and
// the reverse on Decode.
//
// Encode never adds BOS or EOS; [SentencePiece.Specials] gives their ids.
type SentencePiece struct {
	name   string
	pieces []spmPiece

	// The two lookups of sentencepiece's ModelInterface: normal, user-defined and unused
	// pieces (what BPE may form), and control, unknown and byte pieces (only by id).
	pieceIDs map[string]int32
	reserved map[string]int32

	unk, bos, eos int32
	byteFallback  bool
	byteIDs       [256]int32
	unkSurface    string

	addDummyPrefix bool
	removeExtraWS  bool
	escapeWS       bool
	charsMap       *charsMap

	// User-defined symbols: matched longest first, never normalized, never merged.
	user      map[string]bool
	userFirst [256]bool
	userMax   int

	splitLines bool // no piece contains '\n', so lines encode independently

	// byteChar[c] is pieceID of the one-byte character c (c < 0x80), so that the common
	// case of splitting text into characters needs no map lookup.
	byteChar [0x80]int32
	// shadowed: some normal piece has the text of a reserved one, which pieceID prefers,
	// so the id a merge found must be looked up again by text.
	shadowed bool
}

// spmPiece is one vocabulary entry.
type spmPiece struct {
	text  string
	score float32
	typ   int32
}

// SentencePiece piece types (sentencepiece_model.proto, ModelProto.SentencePiece.Type).
const (
	spmNormal      = 1
	spmUnknown     = 2
	spmControl     = 3
	spmUserDefined = 4
	spmUnused      = 5
	spmByte        = 6
)

// spmModelTypes names TrainerSpec.ModelType values for error messages.
var spmModelTypes = map[int32]string{1: "UNIGRAM", 2: "BPE", 3: "WORD", 4: "CHAR"}

// spaceSymbol is U+2581 LOWER ONE EIGHTH BLOCK, which stands for a space in pieces.
const spaceSymbol = "\u2581"

// LoadSentencePiece reads a SentencePiece model (tokenizer.model). Only BPE models are
// supported (LLaMA's kind); a Unigram, word or char model is an error that says so.
func LoadSentencePiece(path string) (*SentencePiece, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("data: sentencepiece model: %w", err)
	}
	t, err := parseSentencePiece(b)
	if err != nil {
		return nil, fmt.Errorf("data: sentencepiece model %s: %w", path, err)
	}
	t.name = path
	return t, nil
}

// spmSpec holds the fields of TrainerSpec and NormalizerSpec the tokenizer uses, with the
// proto2 defaults of sentencepiece_model.proto.
type spmSpec struct {
	modelType               int32
	byteFallback            bool
	treatWhitespaceAsSuffix bool
	unkPiece, bosPiece      string
	eosPiece, unkSurface    string

	normName           string
	charsMap           []byte
	addDummyPrefix     bool
	removeExtraWS      bool
	escapeWS           bool
	denormCharsMapSize int
}

func parseSentencePiece(b []byte) (*SentencePiece, error) {
	spec := spmSpec{
		modelType: 1, unkPiece: "<unk>", bosPiece: "<s>", eosPiece: "</s>", unkSurface: " \u2047 ",
		addDummyPrefix: true, removeExtraWS: true, escapeWS: true,
	}
	var pieces []spmPiece
	r := protoReader{b: b}
	for !r.done() {
		field, wire, err := r.key()
		if err != nil {
			return nil, err
		}
		switch {
		case field == 1 && wire == wireBytes: // repeated SentencePiece pieces
			m, err := r.bytes()
			if err != nil {
				return nil, err
			}
			p, err := parseSPMPiece(m)
			if err != nil {
				return nil, fmt.Errorf("piece %d: %w", len(pieces), err)
			}
			pieces = append(pieces, p)
		case field == 2 && wire == wireBytes: // TrainerSpec trainer_spec
			m, err := r.bytes()
			if err != nil {
				return nil, err
			}
			if err := parseSPMTrainerSpec(m, &spec); err != nil {
				return nil, fmt.Errorf("trainer_spec: %w", err)
			}
		case field == 3 && wire == wireBytes: // NormalizerSpec normalizer_spec
			m, err := r.bytes()
			if err != nil {
				return nil, err
			}
			if err := parseSPMNormalizerSpec(m, &spec, false); err != nil {
				return nil, fmt.Errorf("normalizer_spec: %w", err)
			}
		case field == 5 && wire == wireBytes: // NormalizerSpec denormalizer_spec
			m, err := r.bytes()
			if err != nil {
				return nil, err
			}
			if err := parseSPMNormalizerSpec(m, &spec, true); err != nil {
				return nil, fmt.Errorf("denormalizer_spec: %w", err)
			}
		default:
			if err := r.skip(wire); err != nil {
				return nil, err
			}
		}
	}
	if len(pieces) == 0 {
		return nil, errors.New("no pieces: not a sentencepiece ModelProto")
	}
	if spec.modelType != 2 {
		name := spmModelTypes[spec.modelType]
		if name == "" {
			name = fmt.Sprintf("%d", spec.modelType)
		}
		return nil, fmt.Errorf("model_type %s is not supported: only BPE models (as LLaMA's tokenizer.model) are", name)
	}
	if spec.treatWhitespaceAsSuffix {
		return nil, errors.New("treat_whitespace_as_suffix = true is not supported")
	}
	if spec.denormCharsMapSize > 0 {
		return nil, errors.New("a denormalizer (denormalizer_spec.precompiled_charsmap) is not supported")
	}
	t := &SentencePiece{
		pieces:         pieces,
		pieceIDs:       make(map[string]int32, len(pieces)),
		reserved:       make(map[string]int32),
		unk:            -1,
		byteFallback:   spec.byteFallback,
		unkSurface:     spec.unkSurface,
		addDummyPrefix: spec.addDummyPrefix,
		removeExtraWS:  spec.removeExtraWS,
		escapeWS:       spec.escapeWS,
		user:           make(map[string]bool),
		splitLines:     true,
	}
	for i := range t.byteIDs {
		t.byteIDs[i] = -1
	}
	if len(spec.charsMap) > 0 {
		cm, err := parseCharsMap(spec.charsMap)
		if err != nil {
			return nil, fmt.Errorf("normalizer_spec %q: precompiled_charsmap: %w", spec.normName, err)
		}
		t.charsMap = cm
	}
	for i, p := range pieces {
		id := int32(i)
		if p.text == "" {
			return nil, fmt.Errorf("piece %d is empty", i)
		}
		m := t.reserved
		switch p.typ {
		case spmNormal, spmUserDefined, spmUnused:
			m = t.pieceIDs
		case spmUnknown, spmControl, spmByte:
		default:
			return nil, fmt.Errorf("piece %d %q has unknown type %d", i, p.text, p.typ)
		}
		if prev, dup := m[p.text]; dup {
			return nil, fmt.Errorf("piece %d %q is already defined (piece %d)", i, p.text, prev)
		}
		m[p.text] = id
		if p.typ == spmNormal || p.typ == spmUserDefined || p.typ == spmUnused {
			if strings.Contains(p.text, "\n") {
				t.splitLines = false
			}
		}
		switch p.typ {
		case spmUserDefined:
			t.user[p.text] = true
			t.userFirst[p.text[0]] = true
			t.userMax = max(t.userMax, len(p.text))
		case spmUnknown:
			if t.unk >= 0 {
				return nil, fmt.Errorf("piece %d %q: unknown piece already defined (%d)", i, p.text, t.unk)
			}
			t.unk = id
		case spmByte:
			if !spec.byteFallback {
				return nil, fmt.Errorf("piece %d %q is a byte piece but trainer_spec.byte_fallback is false", i, p.text)
			}
			v, ok := pieceByte(p.text)
			if !ok {
				return nil, fmt.Errorf("piece %d %q is a byte piece but not of the form <0xNN>", i, p.text)
			}
			t.byteIDs[v] = id
		}
	}
	if t.unk < 0 {
		return nil, errors.New("no unknown piece (type UNKNOWN)")
	}
	if spec.byteFallback {
		for v, id := range t.byteIDs {
			if id < 0 {
				return nil, fmt.Errorf("trainer_spec.byte_fallback is true but byte piece <0x%02X> is missing", v)
			}
		}
	}
	for c := range t.byteChar {
		t.byteChar[c] = t.pieceID(string(rune(c)))
	}
	for p := range t.pieceIDs {
		if _, ok := t.reserved[p]; ok {
			t.shadowed = true
		}
	}
	t.bos = t.controlID(spec.bosPiece)
	t.eos = t.controlID(spec.eosPiece)
	return t, nil
}

// controlID is the id of the control piece p, or -1 (sentencepiece's bos_id and eos_id).
func (t *SentencePiece) controlID(p string) int32 {
	if id, ok := t.reserved[p]; ok && t.pieces[id].typ == spmControl {
		return id
	}
	return -1
}

func parseSPMPiece(b []byte) (spmPiece, error) {
	p := spmPiece{typ: spmNormal}
	r := protoReader{b: b}
	for !r.done() {
		field, wire, err := r.key()
		if err != nil {
			return p, err
		}
		switch {
		case field == 1 && wire == wireBytes:
			s, err := r.bytes()
			if err != nil {
				return p, err
			}
			p.text = string(s)
		case field == 2 && wire == wireFixed32:
			v, err := r.fixed32()
			if err != nil {
				return p, err
			}
			p.score = math.Float32frombits(v)
		case field == 3 && wire == wireVarint:
			v, err := r.varint()
			if err != nil {
				return p, err
			}
			p.typ = int32(v)
		default:
			if err := r.skip(wire); err != nil {
				return p, err
			}
		}
	}
	return p, nil
}

func parseSPMTrainerSpec(b []byte, s *spmSpec) error {
	r := protoReader{b: b}
	for !r.done() {
		field, wire, err := r.key()
		if err != nil {
			return err
		}
		var dst *string
		switch field {
		case 45:
			dst = &s.unkPiece
		case 46:
			dst = &s.bosPiece
		case 47:
			dst = &s.eosPiece
		case 44:
			dst = &s.unkSurface
		}
		switch {
		case dst != nil && wire == wireBytes:
			v, err := r.bytes()
			if err != nil {
				return err
			}
			*dst = string(v)
		case (field == 3 || field == 24 || field == 35) && wire == wireVarint:
			v, err := r.varint()
			if err != nil {
				return err
			}
			switch field {
			case 3:
				s.modelType = int32(v)
			case 24:
				s.treatWhitespaceAsSuffix = v != 0
			case 35:
				s.byteFallback = v != 0
			}
		default:
			if err := r.skip(wire); err != nil {
				return err
			}
		}
	}
	return nil
}

func parseSPMNormalizerSpec(b []byte, s *spmSpec, denorm bool) error {
	r := protoReader{b: b}
	for !r.done() {
		field, wire, err := r.key()
		if err != nil {
			return err
		}
		switch {
		case (field == 1 || field == 2) && wire == wireBytes:
			v, err := r.bytes()
			if err != nil {
				return err
			}
			switch {
			case denorm:
				if field == 2 {
					s.denormCharsMapSize = len(v)
				}
			case field == 1:
				s.normName = string(v)
			default:
				s.charsMap = v
			}
		case field >= 3 && field <= 5 && wire == wireVarint:
			v, err := r.varint()
			if err != nil {
				return err
			}
			if denorm {
				continue
			}
			switch field {
			case 3:
				s.addDummyPrefix = v != 0
			case 4:
				s.removeExtraWS = v != 0
			case 5:
				s.escapeWS = v != 0
			}
		default:
			if err := r.skip(wire); err != nil {
				return err
			}
		}
	}
	return nil
}

// pieceByte parses a byte piece "<0xNN>".
func pieceByte(p string) (byte, bool) {
	if len(p) != 6 || p[:3] != "<0x" || p[5] != '>' {
		return 0, false
	}
	hi, ok1 := unhex(p[3])
	lo, ok2 := unhex(p[4])
	return hi<<4 | lo, ok1 && ok2
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// Name returns the path the model was loaded from.
func (t *SentencePiece) Name() string { return t.name }

// VocabSize returns the number of pieces.
func (t *SentencePiece) VocabSize() int { return len(t.pieces) }

// Specials returns the ids of the BOS and EOS control pieces ("<s>" and "</s>" unless the
// model names others), -1 for one the model does not have.
func (t *SentencePiece) Specials() (bos, eos int32) { return t.bos, t.eos }

// Piece returns the text of piece id ("▁the", "<0x0A>", "<s>"), or "" if id is out of range.
func (t *SentencePiece) Piece(id int32) string {
	if id < 0 || int(id) >= len(t.pieces) {
		return ""
	}
	return t.pieces[id].text
}

// Encode returns the ids of text, without BOS or EOS.
func (t *SentencePiece) Encode(text []byte) []int32 {
	return t.AppendEncode(nil, text)
}

// AppendEncode appends the ids of text to dst and returns the extended slice.
func (t *SentencePiece) AppendEncode(dst []int32, text []byte) []int32 {
	norm := t.normalize(text)
	if len(norm) == 0 {
		return dst
	}
	var w bpeWork
	prevUnk := false
	splitLines(norm, t.splitLines, func(start, end int) {
		dst, prevUnk = t.encodeSegment(dst, norm[start:end], &w, prevUnk)
	})
	return dst
}

// encodeSegment runs sentencepiece's BPE over the normalized text s and appends the ids.
// prevUnk says whether the previous id appended was an unknown piece (runs of unknown
// pieces become one id when there is no byte fallback).
func (t *SentencePiece) encodeSegment(dst []int32, s []byte, w *bpeWork, prevUnk bool) ([]int32, bool) {
	w.reset()
	// Split into characters; a user-defined symbol is one frozen symbol.
	for i := 0; i < len(s); {
		if c := s[i]; c < 0x80 && !t.userFirst[c] {
			w.add(i, i+1, t.byteChar[c], false)
			i++
			continue
		}
		n, user := t.prefixMatch(s[i:])
		w.add(i, i+n, t.pieceID(string(s[i:i+n])), user)
		i += n
	}
	// sentencepiece's rev_merge: how an unused piece that BPE formed splits back.
	var revMerge map[string][2]string
	try := func(l, r int32) {
		if l < 0 || r < 0 {
			return
		}
		a, b := &w.syms[l], &w.syms[r]
		if a.frozen || b.frozen {
			return
		}
		piece := s[a.start:b.end]
		id, ok := t.pieceIDs[string(piece)]
		if !ok {
			return
		}
		p := &t.pieces[id]
		w.queue.push(bpeCand{prio: float64(p.score), left: l, right: r, aux: int32(len(piece)), id: id})
		if p.typ == spmUnused {
			if revMerge == nil {
				revMerge = make(map[string][2]string)
			}
			revMerge[string(piece)] = [2]string{string(s[a.start:a.end]), string(s[b.start:b.end])}
		}
	}
	for i := int32(1); i < int32(len(w.syms)); i++ {
		try(i-1, i)
	}
	for len(w.queue) > 0 {
		c := w.queue.pop()
		a, b := &w.syms[c.left], &w.syms[c.right]
		if a.start == a.end || b.start == b.end || (a.end-a.start)+(b.end-b.start) != c.aux {
			continue // stale: one side has changed since the candidate was made
		}
		w.merge(c.left, c.right)
		w.syms[c.left].id = c.id
		try(w.syms[c.left].prev, c.left)
		try(c.left, w.syms[c.left].next)
	}
	for i := int32(0); i >= 0; i = w.syms[i].next {
		sym := w.syms[i]
		id := sym.id
		if t.shadowed {
			id = t.pieceID(string(s[sym.start:sym.end]))
		}
		dst, prevUnk = t.emit(dst, id, s[sym.start:sym.end], revMerge, prevUnk)
	}
	return dst, prevUnk
}

// emit appends the id(s) of one final BPE symbol, piece with id pieceID(piece): unused
// pieces split back, unknown ones as byte pieces or a (merged) unknown id.
func (t *SentencePiece) emit(dst []int32, id int32, piece []byte, revMerge map[string][2]string, prevUnk bool) ([]int32, bool) {
	if t.pieces[id].typ == spmUnused {
		if parts, ok := revMerge[string(piece)]; ok {
			l, r := []byte(parts[0]), []byte(parts[1])
			dst, prevUnk = t.emit(dst, t.pieceID(parts[0]), l, revMerge, prevUnk)
			return t.emit(dst, t.pieceID(parts[1]), r, revMerge, prevUnk)
		}
	}
	if id != t.unk {
		return append(dst, id), false
	}
	if t.byteFallback {
		for _, c := range piece {
			dst = append(dst, t.byteIDs[c])
		}
		return dst, false
	}
	if !prevUnk {
		dst = append(dst, id)
	}
	return dst, true
}

// pieceID is sentencepiece's PieceToId: reserved pieces first, then the others, else unk.
func (t *SentencePiece) pieceID(p string) int32 {
	if id, ok := t.reserved[p]; ok {
		return id
	}
	if id, ok := t.pieceIDs[p]; ok {
		return id
	}
	return t.unk
}

// prefixMatch returns the length of the user-defined symbol s starts with (the longest),
// or of its first UTF-8 character.
func (t *SentencePiece) prefixMatch(s []byte) (n int, user bool) {
	if t.userMax > 0 && t.userFirst[s[0]] {
		for l := min(t.userMax, len(s)); l > 0; l-- {
			if t.user[string(s[:l])] {
				return l, true
			}
		}
	}
	return oneCharLen(s), false
}

// oneCharLen is the byte length of the UTF-8 character s starts with, from its first byte
// alone, as sentencepiece's OneCharLen (normalized text is valid UTF-8).
func oneCharLen(s []byte) int {
	c := s[0]
	n := 1
	switch {
	case c >= 0xF0:
		n = 4
	case c >= 0xE0:
		n = 3
	case c >= 0xC0:
		n = 2
	}
	return min(n, len(s))
}

// normalize is sentencepiece's Normalizer::Normalize.
func (t *SentencePiece) normalize(in []byte) []byte {
	if len(in) == 0 {
		return nil
	}
	if t.removeExtraWS {
		for len(in) > 0 {
			sp, n := t.normalizePrefix(in)
			if string(sp) != " " {
				break
			}
			in = in[n:]
		}
	}
	if len(in) == 0 {
		return nil
	}
	out := make([]byte, 0, len(in)+len(in)/4+8)
	addWS := func() {
		if t.escapeWS {
			out = append(out, spaceSymbol...)
		} else {
			out = append(out, ' ')
		}
	}
	if t.addDummyPrefix {
		addWS()
	}
	prevSpace := t.removeExtraWS
	for len(in) > 0 {
		sp, n := t.normalizePrefix(in)
		for prevSpace && len(sp) > 0 && sp[0] == ' ' {
			sp = sp[1:]
		}
		if len(sp) > 0 {
			for _, c := range sp {
				if c == ' ' && t.escapeWS {
					out = append(out, spaceSymbol...)
				} else {
					out = append(out, c)
				}
			}
			prevSpace = sp[len(sp)-1] == ' '
		}
		in = in[n:]
		if !t.removeExtraWS {
			prevSpace = false
		}
	}
	if t.removeExtraWS {
		space := " "
		if t.escapeWS {
			space = spaceSymbol
		}
		for bytes.HasSuffix(out, []byte(space)) {
			out = out[:len(out)-len(space)]
		}
	}
	return out
}

// replacementChar is U+FFFD in UTF-8, what malformed input becomes.
var replacementChar = []byte("\uFFFD")

// normalizePrefix returns the normalized form of the start of in and how many bytes of in
// it consumed: a user-defined symbol as is, else the longest rule of the character map,
// else one character (a malformed byte becomes U+FFFD).
func (t *SentencePiece) normalizePrefix(in []byte) ([]byte, int) {
	if t.userMax > 0 {
		if n, user := t.prefixMatch(in); user {
			return in[:n], n
		}
	}
	if t.charsMap != nil {
		if n, repl := t.charsMap.longestPrefix(in); n > 0 {
			return repl, n
		}
	}
	r, n := utf8.DecodeRune(in)
	if r == utf8.RuneError && n <= 1 {
		return replacementChar, 1
	}
	return in[:n], n
}

// Decode returns the text of ids as sentencepiece decodes it: "▁" becomes a space, the
// dummy-prefix space of the first piece is dropped, runs of byte pieces become the
// characters they encode (U+FFFD for each byte that is not part of valid UTF-8), control
// pieces (BOS, EOS) vanish and the unknown piece becomes its surface (" ⁇ "). An id
// outside the vocabulary decodes to U+FFFD.
func (t *SentencePiece) Decode(ids []int32) []byte {
	var out, run []byte
	flush := func() {
		for len(run) > 0 {
			r, n := utf8.DecodeRune(run)
			if r == utf8.RuneError && n <= 1 {
				out = append(out, replacementChar...)
				n = 1
			} else {
				out = append(out, run[:n]...)
			}
			run = run[n:]
		}
	}
	bosWS, bosWSSeen := true, false
	for _, id := range ids {
		if id >= 0 && int(id) < len(t.pieces) && t.pieces[id].typ == spmByte {
			v, _ := pieceByte(t.pieces[id].text)
			run = append(run, v)
			continue
		}
		flush()
		if bosWSSeen || len(out) > 0 {
			bosWS = false
		}
		bosWSSeen = false
		if id < 0 || int(id) >= len(t.pieces) {
			out = append(out, replacementChar...)
			continue
		}
		p := t.pieces[id]
		switch p.typ {
		case spmControl:
			continue
		case spmUnknown:
			out = append(out, t.unkSurface...)
			continue
		}
		piece := p.text
		if bosWS && (t.addDummyPrefix || t.removeExtraWS) {
			var ok bool
			piece, ok = strings.CutPrefix(piece, spaceSymbol)
			bosWSSeen = ok && !t.removeExtraWS
		}
		for {
			i := strings.Index(piece, spaceSymbol)
			if i < 0 {
				break
			}
			out = append(out, piece[:i]...)
			out = append(out, ' ')
			piece = piece[i+len(spaceSymbol):]
		}
		out = append(out, piece...)
	}
	flush()
	return out
}

// charsMap is sentencepiece's precompiled character map: a Darts-clone double-array trie
// of source strings whose values index NUL-terminated replacements.
type charsMap struct {
	units      []uint32
	normalized []byte
}

// parseCharsMap reads <trie size in bytes, uint32 LE><trie units, uint32 LE><replacements>.
func parseCharsMap(b []byte) (*charsMap, error) {
	if len(b) <= 4 {
		return nil, fmt.Errorf("%d bytes is too short", len(b))
	}
	size := binary.LittleEndian.Uint32(b)
	if uint64(size) >= uint64(len(b)-4) || size%4 != 0 || size == 0 {
		return nil, fmt.Errorf("trie size %d does not fit a blob of %d bytes", size, len(b))
	}
	m := &charsMap{units: make([]uint32, size/4), normalized: b[4+size:]}
	for i := range m.units {
		m.units[i] = binary.LittleEndian.Uint32(b[4+4*i:])
	}
	return m, nil
}

// longestPrefix returns the length of the longest source string s starts with and its
// replacement; n = 0 if none matches.
func (m *charsMap) longestPrefix(s []byte) (n int, repl []byte) {
	u := m.units
	offset := func(unit uint32) uint32 { return (unit >> 10) << ((unit & (1 << 9)) >> 6) }
	pos := offset(u[0])
	value := -1
	for i, c := range s {
		pos ^= uint32(c)
		if pos >= uint32(len(u)) {
			break
		}
		unit := u[pos]
		if unit&((1<<31)|0xFF) != uint32(c) { // label
			break
		}
		pos ^= offset(unit)
		if pos >= uint32(len(u)) {
			break
		}
		if unit>>8&1 == 1 { // has leaf: the value sits at the next position
			n, value = i+1, int(u[pos]&(1<<31-1))
		}
	}
	if value < 0 || value >= len(m.normalized) {
		return 0, nil
	}
	r := m.normalized[value:]
	if end := bytes.IndexByte(r, 0); end >= 0 {
		r = r[:end]
	}
	return n, r
}

// Protocol buffer wire types.
const (
	wireVarint  = 0
	wireFixed64 = 1
	wireBytes   = 2
	wireFixed32 = 5
)

// protoReader decodes the protocol buffer wire format, enough for sentencepiece's
// ModelProto: varints, fixed-width numbers and length-delimited fields; groups are
// rejected. Errors name the byte offset.
type protoReader struct {
	b   []byte
	off int
}

func (r *protoReader) done() bool { return r.off >= len(r.b) }

func (r *protoReader) varint() (uint64, error) {
	var v uint64
	for shift := uint(0); shift < 64; shift += 7 {
		if r.off >= len(r.b) {
			return 0, fmt.Errorf("protobuf: truncated varint at byte %d", r.off)
		}
		c := r.b[r.off]
		r.off++
		v |= uint64(c&0x7F) << shift
		if c < 0x80 {
			return v, nil
		}
	}
	return 0, fmt.Errorf("protobuf: varint longer than 10 bytes at byte %d", r.off)
}

func (r *protoReader) key() (field, wire int, err error) {
	at := r.off
	k, err := r.varint()
	if err != nil {
		return 0, 0, err
	}
	field, wire = int(k>>3), int(k&7)
	if field == 0 {
		return 0, 0, fmt.Errorf("protobuf: field number 0 at byte %d", at)
	}
	return field, wire, nil
}

func (r *protoReader) bytes() ([]byte, error) {
	at := r.off
	n, err := r.varint()
	if err != nil {
		return nil, err
	}
	if n > uint64(len(r.b)-r.off) {
		return nil, fmt.Errorf("protobuf: field of %d bytes at byte %d runs past the end (%d bytes)", n, at, len(r.b))
	}
	v := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return v, nil
}

func (r *protoReader) fixed32() (uint32, error) {
	if len(r.b)-r.off < 4 {
		return 0, fmt.Errorf("protobuf: truncated fixed32 at byte %d", r.off)
	}
	v := binary.LittleEndian.Uint32(r.b[r.off:])
	r.off += 4
	return v, nil
}

func (r *protoReader) skip(wire int) error {
	switch wire {
	case wireVarint:
		_, err := r.varint()
		return err
	case wireBytes:
		_, err := r.bytes()
		return err
	case wireFixed32:
		_, err := r.fixed32()
		return err
	case wireFixed64:
		if len(r.b)-r.off < 8 {
			return fmt.Errorf("protobuf: truncated fixed64 at byte %d", r.off)
		}
		r.off += 8
		return nil
	}
	return fmt.Errorf("protobuf: unsupported wire type %d before byte %d", wire, r.off)
}

func (t *SentencePiece) setName(n string) { t.name = n }
