package httpdoor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/schemas"
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
// in the dialect's words.
func readMembers(body []byte, members []member, wrongType func(member) *frontdoor.Failure) (fields map[string]json.RawMessage, f *frontdoor.Failure) {
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
