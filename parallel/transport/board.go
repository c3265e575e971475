package transport

import "unicode/utf8"

// boardValues is the length of one message on the error board, in float32 values: the byte
// count, then one byte a value. Longer errors are cut (with "…").
const boardValues = 4096

// BoardMessage is an error that a rank posted on the error board (ErrorBoard).
type BoardMessage struct {
	Rank int
	Text string
}

// encodeBoard writes text as one error-board message: boardValues float32 values, the byte
// count first, then a byte a value (exact in float32); text longer than fits is cut at a
// character boundary and ends in "…".
func encodeBoard(text string) []float32 {
	const ellipsis = "…"
	if len(text) > boardValues-1 {
		cut := boardValues - 1 - len(ellipsis)
		for cut > 0 && !utf8.RuneStart(text[cut]) {
			cut--
		}
		text = text[:cut] + ellipsis
	}
	buf := make([]float32, boardValues)
	buf[0] = float32(len(text))
	for i := 0; i < len(text); i++ {
		buf[1+i] = float32(text[i])
	}
	return buf
}

// decodeBoard is the text of a message encodeBoard wrote ("" for a malformed one).
func decodeBoard(buf []float32) string {
	if len(buf) == 0 {
		return ""
	}
	n := int(buf[0])
	if n < 0 || n > len(buf)-1 {
		return ""
	}
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(buf[1+i])
	}
	return string(b)
}
