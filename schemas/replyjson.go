package schemas

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// The dispatcher decodes every reply of every attempt, and encoding/json
// spends most of that on reflection and on a validation pass of its own.
// decodeFlat reads a reply in one pass instead, field by field, and declines
// every input it does not read exactly as json.Unmarshal would: invalid
// JSON, escaped or case-folded keys, a field given twice, a value of the
// wrong type, nesting deeper than maxFlatDepth. Declined input goes to
// json.Unmarshal, so results and errors are the same on any input.

// maxFlatDepth is the nesting decodeFlat follows inside unknown fields.
const maxFlatDepth = 64

// wireField names a field of a message and points at it. dst is one of
// *string, *int, *int64, *bool, *json.RawMessage, **int64 or *Usage.
type wireField struct {
	name string
	dst  any
}

// flatDecodable is a message decodeFlat can read: a Reply or a Usage.
type flatDecodable interface{}

// wireFieldsOf appends m's fields to f. A type switch rather than an
// interface method, so that f can stay on the caller's stack.
func wireFieldsOf(m flatDecodable, f []wireField) []wireField {
	switch m := m.(type) {
	case *Accept:
		return m.wireFields(f)
	case *Busy:
		return m.wireFields(f)
	case *Heartbeat:
		return m.wireFields(f)
	case *FirstByte:
		return m.wireFields(f)
	case *Chunk:
		return m.wireFields(f)
	case *AttemptResult:
		return m.wireFields(f)
	case *Usage:
		return m.wireFields(f)
	}
	return f
}

func (m *Accept) wireFields(f []wireField) []wireField {
	return append(f, wireField{"v", &m.V}, wireField{"group_id", &m.GroupID}, wireField{"attempt", &m.Attempt},
		wireField{"worker_id", &m.WorkerID}, wireField{"control_inbox", &m.ControlInbox})
}

func (m *Busy) wireFields(f []wireField) []wireField {
	return append(f, wireField{"v", &m.V}, wireField{"group_id", &m.GroupID}, wireField{"attempt", &m.Attempt},
		wireField{"worker_id", &m.WorkerID})
}

func (m *Heartbeat) wireFields(f []wireField) []wireField {
	return append(f, wireField{"v", &m.V}, wireField{"group_id", &m.GroupID}, wireField{"attempt", &m.Attempt},
		wireField{"seq", &m.Seq})
}

func (m *FirstByte) wireFields(f []wireField) []wireField {
	return append(f, wireField{"v", &m.V}, wireField{"group_id", &m.GroupID}, wireField{"attempt", &m.Attempt},
		wireField{"elapsed_ms", &m.ElapsedMs})
}

func (m *Chunk) wireFields(f []wireField) []wireField {
	return append(f, wireField{"v", &m.V}, wireField{"group_id", &m.GroupID}, wireField{"attempt", &m.Attempt},
		wireField{"seq", &m.Seq}, wireField{"delta", &m.Delta}, wireField{"tool_calls", &m.ToolCalls},
		wireField{"tokens", &m.Tokens}, wireField{"cumulative_tokens", &m.CumulativeTokens}, wireField{"first", &m.First})
}

func (m *AttemptResult) wireFields(f []wireField) []wireField {
	return append(f, wireField{"v", &m.V}, wireField{"group_id", &m.GroupID}, wireField{"attempt", &m.Attempt},
		wireField{"worker_id", &m.WorkerID}, wireField{"status_class", (*string)(&m.StatusClass)},
		wireField{"error_scope", (*string)(&m.ErrorScope)}, wireField{"http_status", &m.HTTPStatus},
		wireField{"retry_after_ms", &m.RetryAfterMs}, wireField{"finish_reason", &m.FinishReason},
		wireField{"content", &m.Content}, wireField{"tool_calls", &m.ToolCalls}, wireField{"last_seq", &m.LastSeq},
		wireField{"usage", &m.Usage}, wireField{"first_byte_ms", &m.FirstByteMs}, wireField{"elapsed_ms", &m.ElapsedMs},
		wireField{"cancellation_observed", &m.CancellationObserved}, wireField{"error_message", &m.ErrorMessage})
}

func (u *Usage) wireFields(f []wireField) []wireField {
	return append(f, wireField{"input_units", &u.InputUnits}, wireField{"output_units", &u.OutputUnits},
		wireField{"estimated", &u.Estimated})
}

// decodeFlat decodes data into m in one pass; false declines the input,
// leaving m in any state.
func decodeFlat(data []byte, m flatDecodable) bool {
	r := flatReader{data: data}
	return r.object(m, 0) && r.end()
}

// flatReader is decodeFlat's strict JSON reader over one document. Every
// method returns false to decline the input.
type flatReader struct {
	data []byte
	i    int
}

// object reads an object into m's fields, skipping unknown ones.
func (r *flatReader) object(m flatDecodable, depth int) bool {
	var buf [20]wireField
	fields := wireFieldsOf(m, buf[:0])
	if len(fields) == 0 {
		return false
	}
	var seen uint32
	return r.members(func(key []byte) bool {
		f := fieldIndex(key, fields)
		switch {
		case f == -1:
			return r.skip(depth + 1)
		case f < 0 || seen&(1<<f) != 0:
			return false
		}
		seen |= 1 << f
		return r.value(fields[f].dst, depth+1)
	})
}

// value reads the value of a known field into dst.
func (r *flatReader) value(dst any, depth int) bool {
	if r.peek() == 'n' {
		if !r.literal("null") {
			return false
		}
		// null leaves a value as it is, but sets a pointer to nil and is
		// kept as is by a RawMessage.
		switch d := dst.(type) {
		case **int64:
			*d = nil
		case *json.RawMessage:
			*d = append((*d)[:0], "null"...)
		}
		return true
	}
	switch d := dst.(type) {
	case *string:
		return r.str(d)
	case *int:
		n, ok := r.integer()
		*d = int(n)
		return ok && int64(*d) == n
	case *int64:
		n, ok := r.integer()
		*d = n
		return ok
	case **int64:
		n, ok := r.integer()
		if *d == nil {
			*d = new(int64)
		}
		**d = n
		return ok
	case *bool:
		switch {
		case r.literal("true"):
			*d = true
		case r.literal("false"):
			*d = false
		default:
			return false
		}
		return true
	case *json.RawMessage:
		start := r.i
		if !r.skip(depth) {
			return false
		}
		*d = append((*d)[:0], r.data[start:r.i]...)
		return true
	case *Usage:
		return r.object(d, depth)
	}
	return false
}

// fieldIndex is the index of the field named key, -1 when no field has
// that name, or -2 when encoding/json might still match it to one: an
// escaped key, invalid UTF-8, or a case-insensitive match.
func fieldIndex(key []byte, fields []wireField) int {
	plain := true // ASCII without escapes: folds only to a name of its length
	for _, c := range key {
		if c >= utf8.RuneSelf || c == '\\' {
			plain = false
			break
		}
	}
	folds := false
	for i, f := range fields {
		if len(f.name) == len(key) {
			if string(key) == f.name {
				return i
			}
			folds = folds || plain && bytes.EqualFold(key, []byte(f.name))
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
	for _, f := range fields {
		if bytes.EqualFold(key, []byte(f.name)) {
			return -2
		}
	}
	return -1
}

// members reads an object, calling field with each key once the reader
// stands at the key's value; field reads the value.
func (r *flatReader) members(field func(key []byte) bool) bool {
	if r.peek() != '{' {
		return false
	}
	r.i++
	if r.peek() == '}' {
		r.i++
		return true
	}
	for {
		if r.peek() != '"' {
			return false
		}
		key, _, ok := r.stringBody()
		if !ok || r.peek() != ':' {
			return false
		}
		r.i++
		r.ws()
		if !field(key) {
			return false
		}
		switch r.peek() {
		case ',':
			r.i++
		case '}':
			r.i++
			return true
		default:
			return false
		}
	}
}

// str reads a string.
func (r *flatReader) str(dst *string) bool {
	if r.peek() != '"' {
		return false
	}
	start := r.i
	body, escaped, ok := r.stringBody()
	if !ok {
		return false
	}
	if !escaped && utf8.Valid(body) {
		*dst = string(body)
		return true
	}
	// Escapes and invalid UTF-8 are rare: encoding/json decodes them.
	return json.Unmarshal(r.data[start:r.i], dst) == nil
}

// integer reads a JSON number with neither fraction nor exponent that fits
// an int64, as encoding/json decodes into an integer field.
func (r *flatReader) integer() (int64, bool) {
	start := r.i
	if !r.number() {
		return 0, false
	}
	lit := r.data[start:r.i]
	if bytes.ContainsAny(lit, ".eE") {
		return 0, false
	}
	n, err := strconv.ParseInt(string(lit), 10, 64)
	return n, err == nil
}

// skip reads and validates any value.
func (r *flatReader) skip(depth int) bool {
	if depth > maxFlatDepth {
		return false
	}
	switch r.peek() {
	case '{':
		return r.members(func([]byte) bool { return r.skip(depth + 1) })
	case '[':
		r.i++
		if r.peek() == ']' {
			r.i++
			return true
		}
		for {
			if !r.skip(depth + 1) {
				return false
			}
			switch r.peek() {
			case ',':
				r.i++
			case ']':
				r.i++
				return true
			default:
				return false
			}
		}
	case '"':
		_, _, ok := r.stringBody()
		return ok
	case 't':
		return r.literal("true")
	case 'f':
		return r.literal("false")
	case 'n':
		return r.literal("null")
	default:
		return r.number()
	}
}

func (r *flatReader) literal(lit string) bool {
	if !bytes.HasPrefix(r.data[r.i:], []byte(lit)) {
		return false
	}
	r.i += len(lit)
	return true
}

// stringBody reads a string, the reader standing at its opening quote, and
// returns the text between the quotes, still escaped, and whether it has
// escapes.
func (r *flatReader) stringBody() (body []byte, escaped, ok bool) {
	r.i++
	start := r.i
	for r.i < len(r.data) {
		c := r.data[r.i]
		switch {
		case c == '"':
			body = r.data[start:r.i]
			r.i++
			return body, escaped, true
		case c < 0x20:
			return nil, false, false
		case c == '\\':
			escaped = true
			r.i++
			if r.i >= len(r.data) {
				return nil, false, false
			}
			switch r.data[r.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				r.i++
			case 'u':
				if r.i+5 > len(r.data) {
					return nil, false, false
				}
				for _, h := range r.data[r.i+1 : r.i+5] {
					if !isHex(h) {
						return nil, false, false
					}
				}
				r.i += 5
			default:
				return nil, false, false
			}
		default:
			r.i++
		}
	}
	return nil, false, false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// number reads a number as the JSON grammar defines it.
func (r *flatReader) number() bool {
	d, i := r.data, r.i
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
	r.i = i
	return true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// ws skips whitespace.
func (r *flatReader) ws() {
	for r.i < len(r.data) {
		switch r.data[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
		default:
			return
		}
	}
}

// peek skips whitespace and returns the next byte, 0 at the end.
func (r *flatReader) peek() byte {
	r.ws()
	if r.i < len(r.data) {
		return r.data[r.i]
	}
	return 0
}

// end reports that only whitespace follows.
func (r *flatReader) end() bool {
	r.ws()
	return r.i == len(r.data)
}
