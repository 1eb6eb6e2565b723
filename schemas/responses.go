package schemas

import (
	"bytes"
	"encoding/json"
)

// responsesTo is the translation of a Responses caller's members for a
// route speaking to (docs/architecture.md §8). No route speaks Responses:
// its typed members reach a route as chat completions or Messages fields,
// and its other members are translated here or refused.
//
// To chat completions: user, safety_identifier, prompt_cache_key,
// service_tier, metadata and store go as sent (chat completions has them
// alike); reasoning.effort becomes reasoning_effort. To Messages: user (or
// safety_identifier) becomes metadata.user_id. To either: store false,
// background false and truncation "disabled" change nothing and are left
// out. Every other member is refused: previous_response_id, conversation,
// include... name state or output a chat route cannot give.
func responsesTo(to Dialect) func(name string, raw json.RawMessage, out map[string]json.RawMessage) error {
	return func(name string, raw json.RawMessage, out map[string]json.RawMessage) error {
		lit := string(bytes.TrimSpace(raw))
		switch {
		case name == "store" && lit == "false", name == "background" && lit == "false",
			name == "truncation" && lit == `"disabled"`:
			return nil
		case to == DialectAnthropic:
			return responsesToAnthropic(name, raw, out)
		}
		switch name {
		case "user", "safety_identifier", "prompt_cache_key", "service_tier", "metadata", "store":
			out[name] = raw
			return nil
		case "reasoning":
			var r map[string]json.RawMessage
			if json.Unmarshal(raw, &r) != nil {
				return &UntranslatableError{Param: name, To: to, Detail: "reasoning must be an object"}
			}
			for key, v := range r {
				switch {
				case isNull(v):
				case key == "effort":
					out["reasoning_effort"] = v
				default:
					return &UntranslatableError{Param: name + "." + key, To: to}
				}
			}
			return nil
		}
		return &UntranslatableError{Param: name, To: to}
	}
}

// responsesToAnthropic translates one Responses member for a Messages
// route: user, else safety_identifier, becomes metadata.user_id.
func responsesToAnthropic(name string, raw json.RawMessage, out map[string]json.RawMessage) error {
	if name != "user" && name != "safety_identifier" {
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
