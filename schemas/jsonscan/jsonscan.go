// Package jsonscan is a strict JSON scanner for the few hot paths that
// decode known fields of small documents (provider stream chunks, wire
// replies) without reflection. Its methods return false to decline input
// they do not read exactly as encoding/json would; callers then fall back
// to encoding/json, so results and errors never differ from it.
package jsonscan

import (
	"bytes"
	"strconv"
	"unicode/utf8"
)

// MaxDepth is the nesting Skip follows; deeper input is declined (encoding/json
// has its own, larger limit).
const MaxDepth = 64

// Scanner reads one JSON document in Data from offset I.
type Scanner struct {
	Data []byte
	I    int
}

// Object reads an object, calling field with each key once the reader
// stands at the key's value; field reads the value.
func (s *Scanner) Object(field func(key []byte) bool) bool {
	if s.Peek() != '{' {
		return false
	}
	s.I++
	if s.Peek() == '}' {
		s.I++
		return true
	}
	for {
		if s.Peek() != '"' {
			return false
		}
		key, _, ok := s.StringBody()
		if !ok || s.Peek() != ':' {
			return false
		}
		s.I++
		if !field(key) {
			return false
		}
		switch s.Peek() {
		case ',':
			s.I++
		case '}':
			s.I++
			return true
		default:
			return false
		}
	}
}

// Integer reads a JSON number with neither fraction nor exponent that fits
// an int64, as encoding/json decodes into an integer field.
func (s *Scanner) Integer() (int64, bool) {
	start := s.I
	if !s.Number() {
		return 0, false
	}
	lit := s.Data[start:s.I]
	if bytes.ContainsAny(lit, ".eE") {
		return 0, false
	}
	n, err := strconv.ParseInt(string(lit), 10, 64)
	return n, err == nil
}

// Skip reads and validates any value.
func (s *Scanner) Skip(depth int) bool {
	if depth > MaxDepth {
		return false
	}
	switch s.Peek() {
	case '{':
		return s.Object(func([]byte) bool { return s.Skip(depth + 1) })
	case '[':
		s.I++
		if s.Peek() == ']' {
			s.I++
			return true
		}
		for {
			if !s.Skip(depth + 1) {
				return false
			}
			switch s.Peek() {
			case ',':
				s.I++
			case ']':
				s.I++
				return true
			default:
				return false
			}
		}
	case '"':
		_, _, ok := s.StringBody()
		return ok
	case 't':
		return s.Literal("true")
	case 'f':
		return s.Literal("false")
	case 'n':
		return s.Literal("null")
	default:
		return s.Number()
	}
}

// Literal reads the literal lit (true, false, null).
func (s *Scanner) Literal(lit string) bool {
	if !bytes.HasPrefix(s.Data[s.I:], []byte(lit)) {
		return false
	}
	s.I += len(lit)
	return true
}

// StringBody reads a string, the reader standing at its opening quote, and
// returns the text between the quotes, still escaped, and whether it has
// escapes.
func (s *Scanner) StringBody() (body []byte, escaped, ok bool) {
	s.I++
	start := s.I
	for s.I < len(s.Data) {
		c := s.Data[s.I]
		switch {
		case c == '"':
			body = s.Data[start:s.I]
			s.I++
			return body, escaped, true
		case c < 0x20:
			return nil, false, false
		case c == '\\':
			escaped = true
			s.I++
			if s.I >= len(s.Data) {
				return nil, false, false
			}
			switch s.Data[s.I] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.I++
			case 'u':
				if s.I+5 > len(s.Data) {
					return nil, false, false
				}
				for _, h := range s.Data[s.I+1 : s.I+5] {
					if !isHex(h) {
						return nil, false, false
					}
				}
				s.I += 5
			default:
				return nil, false, false
			}
		default:
			s.I++
		}
	}
	return nil, false, false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// Number reads a number as the JSON grammar defines it.
func (s *Scanner) Number() bool {
	d := s.Data
	i := s.I
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && '1' <= d[i] && d[i] <= '9':
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	default:
		return false
	}
	if i < len(d) && d[i] == '.' {
		i++
		if i >= len(d) || !isDigit(d[i]) {
			return false
		}
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) || !isDigit(d[i]) {
			return false
		}
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	}
	s.I = i
	return true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// WS skips whitespace.
func (s *Scanner) WS() {
	for s.I < len(s.Data) {
		switch s.Data[s.I] {
		case ' ', '\t', '\n', '\r':
			s.I++
		default:
			return
		}
	}
}

// Peek skips whitespace and returns the next byte, 0 at the end.
func (s *Scanner) Peek() byte {
	s.WS()
	if s.I < len(s.Data) {
		return s.Data[s.I]
	}
	return 0
}

// End reports that only whitespace follows.
func (s *Scanner) End() bool {
	s.WS()
	return s.I == len(s.Data)
}

// FieldIndex is the index of key in names, -1 when key is none of them, or
// -2 when encoding/json might still match it to one of them: an escaped
// key, invalid UTF-8, or a case-insensitive match.
func FieldIndex(key []byte, names []string) int {
	plain := true // ASCII without escapes: folds only to a name of its length
	for _, c := range key {
		if c >= utf8.RuneSelf || c == '\\' {
			plain = false
			break
		}
	}
	folds := false
	for i, n := range names {
		if len(n) == len(key) {
			if string(key) == n {
				return i
			}
			folds = folds || plain && bytes.EqualFold(key, []byte(n))
		}
	}
	if plain {
		if folds {
			return -2
		}
		return -1
	}
	if bytes.IndexByte(key, '\\') >= 0 || !utf8.Valid(key) {
		return -2
	}
	for _, n := range names {
		if bytes.EqualFold(key, []byte(n)) {
			return -2
		}
	}
	return -1
}

// Nesting measures a JSON document's shape in one pass without decoding it:
// the deepest nesting of objects and arrays (a scalar is depth 0, "{}" depth
// 1) and how many objects and arrays it holds. It reads brackets outside
// strings only and does not validate the document, so a caller can refuse
// input whose shape is too costly for a decoder or compiler before handing it
// over, whatever else is wrong with it.
func Nesting(data []byte) (depth, containers int) {
	cur := 0
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '"':
			i = StringEnd(data, i)
		case '{', '[':
			cur++
			containers++
			depth = max(depth, cur)
		case '}', ']':
			cur--
		}
	}
	return depth, containers
}

// StringEnd is the index of the quote closing the string that opens with the
// quote at data[open], or len(data) when the string is not closed. It steps
// over escapes without validating them, for scans that read only what lies
// outside strings (Nesting, a schema's exponents) and need not decode them.
func StringEnd(data []byte, open int) int {
	for i := open + 1; i < len(data); i++ {
		switch data[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return len(data)
}
