package httpdoor

import (
	"bytes"
	"encoding/json"
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
// non-null members into its destination. It returns the first member whose
// value has the wrong type; members it does not name are ignored, as
// OpenAI-compatible servers do.
func readMembers(body []byte, members []member) (wrongType *member, f *frontdoor.Failure) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		return nil, notAnObject
	}
	for i := range members {
		raw, ok := fields[members[i].name]
		if !ok || isJSONNull(raw) {
			continue
		}
		if err := json.Unmarshal(raw, members[i].dst); err != nil {
			return &members[i], nil
		}
	}
	return nil, nil
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
