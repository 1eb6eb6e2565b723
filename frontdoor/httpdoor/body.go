package httpdoor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/schemas/jsonscan"
)

// member is one member of a request body that a dialect reads: its name,
// what its value must be (for the error that names it), and where it goes.
type member struct {
	name, want string
	dst        any
}

// notAnObject answers a body that is not a JSON object.
var notAnObject = &frontdoor.Failure{Code: frontdoor.CodeInvalidJSON, Message: "The request body is not a JSON object."}

// readMembers decodes body as a JSON object and each of its present,
// non-null members into its destination. It returns every member of the
// body by name, as sent, for what the dialect carries on untyped (unread);
// the first member whose value has the wrong type is refused by wrongType,
// in the dialect's words. Every destination holds its zero value.
//
// The door reads every request's body, and encoding/json spends most of
// that on reflection and validation passes of its own (issue 31): a plain
// body is split into its members in one pass (scanMembers), and each
// member of a common type is decoded in one pass (schemas.DecodeValue).
// What either declines goes to encoding/json as before, so the members,
// the values and the failures are those of readMembersCarefully.
func readMembers(body []byte, members []member, wrongType func(member) *frontdoor.Failure) (map[string]json.RawMessage, *frontdoor.Failure) {
	fields, ok := scanMembers(body)
	if !ok {
		return readMembersCarefully(body, members, wrongType)
	}
	for _, m := range members {
		raw, ok := fields[m.name]
		if !ok || isJSONNull(raw) || schemas.DecodeValue(raw, m.dst) {
			continue
		}
		reflect.ValueOf(m.dst).Elem().SetZero() // declined: m.dst may hold part of raw
		if err := json.Unmarshal(raw, m.dst); err != nil {
			return nil, wrongType(m)
		}
	}
	return fields, nil
}

// readMembersCarefully is readMembers with encoding/json alone.
func readMembersCarefully(body []byte, members []member, wrongType func(member) *frontdoor.Failure) (fields map[string]json.RawMessage, f *frontdoor.Failure) {
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		return nil, notAnObject
	}
	for _, m := range members {
		raw, ok := fields[m.name]
		if !ok || isJSONNull(raw) {
			continue
		}
		if err := json.Unmarshal(raw, m.dst); err != nil {
			return nil, wrongType(m)
		}
	}
	return fields, nil
}

// scanMembers splits a JSON object into its members, each value as sent,
// as json.Unmarshal into a map[string]json.RawMessage would (a name sent
// twice keeps its last value). It declines (false) anything else, and keys
// encoding/json would rewrite: escaped ones and invalid UTF-8. The values
// share one copy of body, each capped at its end.
func scanMembers(body []byte) (map[string]json.RawMessage, bool) {
	s := jsonscan.Scanner{Data: body}
	if s.Peek() != '{' {
		return nil, false
	}
	buf := bytes.Clone(body)
	fields := make(map[string]json.RawMessage, 8)
	ok := s.Object(func(key []byte) bool {
		if bytes.IndexByte(key, '\\') >= 0 || !utf8.Valid(key) {
			return false
		}
		s.Peek() // the value starts after any space
		start := s.I
		if !s.Skip(1) {
			return false
		}
		fields[string(key)] = buf[start:s.I:s.I]
		return true
	})
	return fields, ok && s.End()
}

// openAIWrongType refuses a member of the wrong type as OpenAI's APIs do
// (chat completions, embeddings, Responses).
func openAIWrongType(m member) *frontdoor.Failure {
	return frontdoor.InvalidParam(m.name, fmt.Sprintf("Invalid type for '%s': expected %s.", m.name, m.want))
}

// unread is the members of the body that no member of the dialect reads, as
// sent: the canonical request's Extra, which a route of the caller's
// dialect receives unchanged (docs/architecture.md §8). Nil when there are
// none.
func unread(fields map[string]json.RawMessage, members []member) map[string]json.RawMessage {
	var rest map[string]json.RawMessage
	for name, raw := range fields {
		if slices.ContainsFunc(members, func(m member) bool { return m.name == name }) {
			continue
		}
		if rest == nil {
			rest = make(map[string]json.RawMessage)
		}
		rest[name] = raw
	}
	return rest
}

func isJSONNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// validationParam names the field a schemas.ChatRequest.Validate error is
// about: its messages come as "messages[i]: ..." or "<field> ...".
func validationParam(err error) string {
	msg := validationMessage(err)
	if strings.HasPrefix(msg, "messages[") {
		if i := strings.Index(msg, "]"); i > 0 {
			return msg[:i+1]
		}
	}
	field, _, _ := strings.Cut(msg, " ")
	field, _, _ = strings.Cut(field, "[")
	switch field {
	case "max_tokens", "temperature", "top_p", "presence_penalty", "frequency_penalty", "stop", "tools", "tool_choice", "response_format":
		return field
	}
	return ""
}

// validationMessage is a Validate error without its sentinel's text.
func validationMessage(err error) string {
	return strings.ReplaceAll(err.Error(), schemas.ErrMalformedRequest.Error()+": ", "")
}

// invalidRequest answers a request the canonical request's Validate
// refuses; its messages already name their field ("messages[1]: no
// content").
func invalidRequest(err error) *frontdoor.Failure {
	return frontdoor.InvalidParam(validationParam(err), validationMessage(err))
}

// clip bounds a caller's name quoted back in an error message, so that the
// answer to a bad body stays small whatever the body's size.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64]
	}
	return s
}
