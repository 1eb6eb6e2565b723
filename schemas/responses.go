package schemas

import (
	"bytes"
	"encoding/json"
)

// responsesToAnthropic translates one member of a Responses caller for a
// Messages route (docs/architecture.md §8): user, else safety_identifier,
// becomes metadata.user_id; store false, background false and truncation
// "disabled" change nothing and are left out; every other member is
// refused (previous_response_id, conversation, include... name state or
// output a Messages route does not have). An OpenAI route receives them
// all as sent, at its /responses.
func responsesToAnthropic(name string, raw json.RawMessage, out map[string]json.RawMessage) error {
	switch lit := string(bytes.TrimSpace(raw)); {
	case name == "store" && lit == "false", name == "background" && lit == "false",
		name == "truncation" && lit == `"disabled"`:
		return nil
	case name != "user" && name != "safety_identifier":
		return &UntranslatableError{Param: name, To: DialectAnthropic}
	}
	var user string
	if json.Unmarshal(raw, &user) != nil {
		return &UntranslatableError{Param: name, To: DialectAnthropic, Detail: name + " must be a string"}
	}
	// Members come in name order: a user after a safety_identifier
	// replaces it.
	md, _ := json.Marshal(struct {
		UserID string `json:"user_id"`
	}{user}) // a struct of a string always marshals
	out["metadata"] = md
	return nil
}

// checkTypedForResponses refuses the typed fields the Responses API has no
// member for, which an OpenAI route serving a Responses request at its
// /responses could not be sent (a NATS caller can set them; the door never
// does).
func (r *ChatRequest) checkTypedForResponses() error {
	if err := r.checkChatOnlyTyped(DialectResponses); err != nil {
		return err
	}
	if len(r.Stop) > 0 {
		return &UntranslatableError{Param: "stop", To: DialectResponses}
	}
	return nil
}
