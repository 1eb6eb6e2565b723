package schemas

import (
	"encoding/json"
	"unicode/utf8"

	"github.com/hedgerow/hedgerow/schemas/jsonscan"
)

// The dispatcher decodes every reply of every attempt, and encoding/json
// spends most of that on reflection and on a validation pass of its own.
// decodeFlat reads a reply in one pass instead, field by field, and declines
// every input it does not read exactly as json.Unmarshal would: invalid
// JSON, escaped or case-folded keys, a field given twice, a value of the
// wrong type, nesting deeper than jsonscan.MaxDepth. Declined input goes to
// json.Unmarshal, so results and errors are the same on any input.

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
		wireField{"worker_id", &m.WorkerID}, wireField{"control_inbox", &m.ControlInbox}, wireField{"secret", &m.Secret})
}

func (m *Busy) wireFields(f []wireField) []wireField {
	return append(f, wireField{"v", &m.V}, wireField{"group_id", &m.GroupID}, wireField{"attempt", &m.Attempt},
		wireField{"worker_id", &m.WorkerID}, wireField{"secret", &m.Secret})
}

func (m *Heartbeat) wireFields(f []wireField) []wireField {
	return append(f, wireField{"v", &m.V}, wireField{"group_id", &m.GroupID}, wireField{"attempt", &m.Attempt},
		wireField{"seq", &m.Seq}, wireField{"worker_id", &m.WorkerID}, wireField{"secret", &m.Secret})
}

func (m *FirstByte) wireFields(f []wireField) []wireField {
	return append(f, wireField{"v", &m.V}, wireField{"group_id", &m.GroupID}, wireField{"attempt", &m.Attempt},
		wireField{"elapsed_ms", &m.ElapsedMs}, wireField{"worker_id", &m.WorkerID}, wireField{"secret", &m.Secret})
}

func (m *Chunk) wireFields(f []wireField) []wireField {
	return append(f, wireField{"v", &m.V}, wireField{"group_id", &m.GroupID}, wireField{"attempt", &m.Attempt},
		wireField{"seq", &m.Seq}, wireField{"delta", &m.Delta}, wireField{"tool_calls", &m.ToolCalls},
		wireField{"tokens", &m.Tokens}, wireField{"cumulative_tokens", &m.CumulativeTokens}, wireField{"first", &m.First},
		wireField{"worker_id", &m.WorkerID}, wireField{"secret", &m.Secret})
}

func (m *AttemptResult) wireFields(f []wireField) []wireField {
	return append(f, wireField{"v", &m.V}, wireField{"group_id", &m.GroupID}, wireField{"attempt", &m.Attempt},
		wireField{"worker_id", &m.WorkerID}, wireField{"status_class", (*string)(&m.StatusClass)},
		wireField{"error_scope", (*string)(&m.ErrorScope)}, wireField{"http_status", &m.HTTPStatus},
		wireField{"retry_after_ms", &m.RetryAfterMs}, wireField{"finish_reason", &m.FinishReason},
		wireField{"content", &m.Content}, wireField{"tool_calls", &m.ToolCalls}, wireField{"refusal", &m.Refusal}, wireField{"last_seq", &m.LastSeq},
		wireField{"usage", &m.Usage}, wireField{"first_byte_ms", &m.FirstByteMs}, wireField{"elapsed_ms", &m.ElapsedMs},
		wireField{"cancellation_observed", &m.CancellationObserved}, wireField{"error_message", &m.ErrorMessage},
		wireField{"embeddings", &m.Embeddings}, wireField{"max_token_gap_ms", &m.MaxTokenGapMs}, wireField{"secret", &m.Secret})
}

func (u *Usage) wireFields(f []wireField) []wireField {
	return append(f, wireField{"input_units", &u.InputUnits}, wireField{"output_units", &u.OutputUnits},
		wireField{"estimated", &u.Estimated})
}

// decodeFlat decodes data into m in one pass; false declines the input,
// leaving m in any state.
func decodeFlat(data []byte, m flatDecodable) bool {
	r := flatReader{jsonscan.Scanner{Data: data}}
	return r.object(m, 0) && r.End()
}

// flatReader is decodeFlat's strict JSON reader over one document. Every
// method returns false to decline the input.
type flatReader struct{ jsonscan.Scanner }

// object reads an object into m's fields, skipping unknown ones.
func (r *flatReader) object(m flatDecodable, depth int) bool {
	var buf [24]wireField
	fields := wireFieldsOf(m, buf[:0])
	if len(fields) == 0 {
		return false
	}
	var nameBuf [24]string
	names := nameBuf[:len(fields)]
	for i, f := range fields {
		names[i] = f.name
	}
	var seen uint32
	return r.Object(func(key []byte) bool {
		f := jsonscan.FieldIndex(key, names)
		switch {
		case f == -1:
			return r.Skip(depth + 1)
		case f < 0 || seen&(1<<f) != 0:
			return false
		}
		seen |= 1 << f
		return r.value(fields[f].dst, depth+1)
	})
}

// value reads the value of a known field into dst.
func (r *flatReader) value(dst any, depth int) bool {
	if r.Peek() == 'n' {
		if !r.Literal("null") {
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
		n, ok := r.Integer()
		*d = int(n)
		return ok && int64(*d) == n
	case *int64:
		n, ok := r.Integer()
		*d = n
		return ok
	case **int64:
		n, ok := r.Integer()
		if *d == nil {
			*d = new(int64)
		}
		**d = n
		return ok
	case *bool:
		switch {
		case r.Literal("true"):
			*d = true
		case r.Literal("false"):
			*d = false
		default:
			return false
		}
		return true
	case *json.RawMessage:
		start := r.I
		if !r.Skip(depth) {
			return false
		}
		*d = append((*d)[:0], r.Data[start:r.I]...)
		return true
	case *Usage:
		return r.object(d, depth)
	}
	return false
}

// str reads a string.
func (r *flatReader) str(dst *string) bool {
	if r.Peek() != '"' {
		return false
	}
	start := r.I
	body, escaped, ok := r.StringBody()
	if !ok {
		return false
	}
	if !escaped && utf8.Valid(body) {
		*dst = string(body)
		return true
	}
	// Escapes and invalid UTF-8 are rare: encoding/json decodes them.
	return json.Unmarshal(r.Data[start:r.I], dst) == nil
}
