package schemas

import (
	"bytes"
	"encoding/json"
	"strconv"
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
// *string, *int, *int64, *bool, *json.RawMessage, **int, **int64, **float64,
// **bool, *[]string, *map[string]json.RawMessage, *CommitPoint, *Usage,
// *ChatRequest, *[]Message, **Continuation or **EmbeddingRequest (only
// null is read into the last: an embeddings attempt is declined).
type wireField struct {
	name string
	dst  any
}

// flatDecodable is a message decodeFlat can read: a Reply, an Attempt, or
// one of the objects they hold (Usage, ChatRequest, Message, Continuation).
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
	case *Attempt:
		return m.wireFields(f)
	case *ChatRequest:
		return m.wireFields(f)
	case *Message:
		return m.wireFields(f)
	case *Continuation:
		return m.wireFields(f)
	}
	return f
}

func (m *Attempt) wireFields(f []wireField) []wireField {
	return append(f, wireField{"v", &m.V}, wireField{"group_id", &m.GroupID}, wireField{"user_action_id", &m.UserActionID},
		wireField{"attempt", &m.Attempt}, wireField{"role", (*string)(&m.Role)}, wireField{"route", &m.Route},
		wireField{"operation_class", &m.OperationClass}, wireField{"model_class", &m.ModelClass},
		wireField{"deadline_unix_ms", &m.DeadlineUnixMs}, wireField{"remaining_ms", &m.RemainingMs},
		wireField{"commit_point", &m.CommitPoint}, wireField{"reply_inbox", &m.ReplyInbox}, wireField{"secret", &m.Secret},
		wireField{"request", &m.Request}, wireField{"stall_after_first_token_ms", &m.StallAfterFirstTokenMs},
		wireField{"continuation", &m.Continuation}, wireField{"folds_first_byte", &m.FoldsFirstByte})
}

func (r *ChatRequest) wireFields(f []wireField) []wireField {
	return append(f, wireField{"model", &r.Model}, wireField{"messages", &r.Messages}, wireField{"max_tokens", &r.MaxTokens},
		wireField{"max_tokens_field", &r.MaxTokensField}, wireField{"temperature", &r.Temperature}, wireField{"top_p", &r.TopP},
		wireField{"presence_penalty", &r.PresencePenalty}, wireField{"frequency_penalty", &r.FrequencyPenalty},
		wireField{"seed", &r.Seed}, wireField{"stop", &r.Stop}, wireField{"tools", &r.Tools}, wireField{"tool_choice", &r.ToolChoice},
		wireField{"response_format", &r.ResponseFormat}, wireField{"parallel_tool_calls", &r.ParallelToolCalls},
		wireField{"stream", &r.Stream}, wireField{"dialect", (*string)(&r.Dialect)}, wireField{"extra", &r.Extra},
		wireField{"embedding", &r.Embedding})
}

func (m *Message) wireFields(f []wireField) []wireField {
	return append(f, wireField{"role", (*string)(&m.Role)}, wireField{"content", &m.Content}, wireField{"name", &m.Name},
		wireField{"tool_calls", &m.ToolCalls}, wireField{"tool_call_id", &m.ToolCallID})
}

func (c *Continuation) wireFields(f []wireField) []wireField {
	return append(f, wireField{"text", &c.Text}, wireField{"offset_tokens", &c.OffsetTokens})
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

// DecodeValue decodes data, one JSON value, into dst in one pass as
// json.Unmarshal would, for a front door's hot members (issue 31): dst is
// one of *string, *bool, *json.RawMessage, **int, **int64, **float64,
// **bool, *[]string, *[]Message or *map[string]json.RawMessage, and holds
// its zero value. It reports false to decline: any other destination, null,
// or input not read exactly as encoding/json would (see decodeFlat); dst is
// then in any state, and the caller resets it and asks encoding/json, whose
// answer (value or error) is the one to give.
func DecodeValue(data []byte, dst any) bool {
	r := flatReader{jsonscan.Scanner{Data: data}}
	if r.Peek() == 'n' {
		return false
	}
	switch dst.(type) {
	case *string, *bool, *json.RawMessage, **int, **int64, **float64, **bool, *[]string, *[]Message, *map[string]json.RawMessage:
	default:
		return false
	}
	return r.value(dst, 0) && r.End()
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
		// null leaves a value (a string, a number, a struct) as it is,
		// but sets a pointer, a slice or a map to nil and is kept as is by
		// a RawMessage.
		switch d := dst.(type) {
		case **int64:
			*d = nil
		case **int:
			*d = nil
		case **float64:
			*d = nil
		case **bool:
			*d = nil
		case *[]string:
			*d = nil
		case *[]Message:
			*d = nil
		case *map[string]json.RawMessage:
			*d = nil
		case **Continuation:
			*d = nil
		case **EmbeddingRequest:
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
	case **int:
		n, ok := r.Integer()
		if *d == nil {
			*d = new(int)
		}
		**d = int(n)
		return ok && int64(**d) == n
	case **float64:
		x, ok := r.float()
		if *d == nil {
			*d = new(float64)
		}
		**d = x
		return ok
	case **bool:
		var b bool
		if !r.value(&b, depth) {
			return false
		}
		*d = &b
		return true
	case *CommitPoint:
		// A TextUnmarshaler: only a plain string it accepts is read here;
		// encoding/json reports anything else.
		var s string
		if r.Peek() != '"' || !r.str(&s) {
			return false
		}
		return d.UnmarshalText([]byte(s)) == nil
	case *ChatRequest:
		return r.object(d, depth)
	case **Continuation:
		if *d == nil {
			*d = new(Continuation)
		}
		return r.object(*d, depth)
	case *[]string:
		if *d == nil {
			*d = []string{} // encoding/json makes [] an empty slice, not nil
		}
		return r.array(depth, func() bool {
			var s string
			if !r.str(&s) {
				return false
			}
			*d = append(*d, s)
			return true
		})
	case *[]Message:
		if *d == nil {
			*d = []Message{}
		}
		return r.array(depth, func() bool {
			*d = append(*d, Message{})
			return r.Peek() == '{' && r.object(&(*d)[len(*d)-1], depth+1)
		})
	case *map[string]json.RawMessage:
		if r.Peek() != '{' {
			return false
		}
		if *d == nil {
			*d = map[string]json.RawMessage{}
		}
		return r.Object(func(key []byte) bool {
			// An escaped key or one of invalid UTF-8 encoding/json would
			// rewrite: declined.
			if bytes.IndexByte(key, '\\') >= 0 || !utf8.Valid(key) {
				return false
			}
			var raw json.RawMessage
			if !r.value(&raw, depth+1) {
				return false
			}
			(*d)[string(key)] = raw // a repeated key: the last wins, as in encoding/json
			return true
		})
	}
	// **EmbeddingRequest other than null, and any type not listed.
	return false
}

// array reads an array, calling elem with the reader at each element;
// null elements are declined (encoding/json would store a zero value).
func (r *flatReader) array(depth int, elem func() bool) bool {
	if r.Peek() != '[' {
		return false
	}
	r.I++
	if r.Peek() == ']' {
		r.I++
		return true
	}
	if depth+1 > jsonscan.MaxDepth {
		return false
	}
	for {
		if r.Peek() == 'n' || !elem() {
			return false
		}
		switch r.Peek() {
		case ',':
			r.I++
		case ']':
			r.I++
			return true
		default:
			return false
		}
	}
}

// float reads a number as encoding/json decodes it into a float64 field.
func (r *flatReader) float() (float64, bool) {
	start := r.I
	if !r.Number() {
		return 0, false
	}
	x, err := strconv.ParseFloat(string(r.Data[start:r.I]), 64)
	return x, err == nil
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
