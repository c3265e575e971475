package data

// This file holds what the SentencePiece and Hugging Face BPE encoders share: the symbol
// list they merge in place and the priority queue of candidate merges. Both follow the
// reference implementations: every adjacent pair that forms a known piece is a candidate,
// the best candidate (highest score or lowest rank; on a tie the leftmost) is merged, the
// two new neighbour pairs become candidates, and stale candidates are skipped when they
// come out of the queue. That is O(n log n) in the length of the text, however long a
// word is.

// bpeSymbol is one symbol of the text being merged: a byte span of the (normalized) text,
// linked to its neighbours. A merged-away symbol has start == end.
type bpeSymbol struct {
	start, end int32 // byte span in the text
	prev, next int32 // neighbour indices, -1 at the ends
	id         int32 // token id
	frozen     bool  // never merged (SentencePiece user-defined symbols)
}

// bpeCand is a candidate merge of symbols left and right (right is left's next at the time
// the candidate was made).
type bpeCand struct {
	prio  float64 // higher merges first: a SentencePiece score, or minus a merge rank
	left  int32
	right int32
	aux   int32 // SentencePiece: byte length of the merged piece; Hugging Face: the merged id
	id    int32 // SentencePiece: the merged piece's id
}

// bpeQueue is a binary max-heap of candidates by priority, then by lower left index, the
// order both sentencepiece and tokenizers use.
type bpeQueue []bpeCand

func (q bpeQueue) before(i, j int) bool {
	if q[i].prio != q[j].prio {
		return q[i].prio > q[j].prio
	}
	return q[i].left < q[j].left
}

func (q *bpeQueue) push(c bpeCand) {
	h := append(*q, c)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h.before(i, p) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	*q = h
}

func (q *bpeQueue) pop() bpeCand {
	h := *q
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h.before(r, l) {
			m = r
		}
		if !h.before(m, i) {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	*q = h
	return top
}

// bpeWork is the scratch space of one encode call.
type bpeWork struct {
	syms  []bpeSymbol
	queue bpeQueue
}

// reset empties w for a new segment, keeping its storage.
func (w *bpeWork) reset() {
	w.syms = w.syms[:0]
	w.queue = w.queue[:0]
}

// add appends a symbol spanning text[start:end] with the given id, linked after the
// previous one.
func (w *bpeWork) add(start, end int, id int32, frozen bool) {
	i := int32(len(w.syms))
	prev := i - 1
	if i > 0 {
		w.syms[i-1].next = i
	}
	w.syms = append(w.syms, bpeSymbol{start: int32(start), end: int32(end), prev: prev, next: -1, id: id, frozen: frozen})
}

// merge joins symbol left with its next neighbour right.
func (w *bpeWork) merge(left, right int32) {
	s := w.syms
	s[left].end = s[right].end
	s[left].next = s[right].next
	if n := s[right].next; n >= 0 {
		s[n].prev = left
	}
	s[right].start = s[right].end // merged away
}

// splitLines calls f for each part of text that ends just after a '\n' (the last part ends
// with the text), or once for all of text if split is false. Encoders whose pieces never
// contain a newline encode each line on its own, which gives the same ids as the whole
// text at once (no merge can cross the newline symbol) while keeping the scratch space
// per line.
func splitLines[T ~string | ~[]byte](text T, split bool, f func(start, end int)) {
	if !split {
		f(0, len(text))
		return
	}
	start := 0
	for i := 0; i < len(text); i++ {
		if text[i] == '\n' {
			f(start, i+1)
			start = i + 1
		}
	}
	if start < len(text) {
		f(start, len(text))
	}
}
