package schemas

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestAContinuationIsOneToMaxBytesOfUTF8WithANonNegativeOffset(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Continuation
		ok   bool
	}{
		{"a few words", Continuation{Text: "Once upon ", OffsetTokens: 3}, true},
		{"exactly the bound", Continuation{Text: strings.Repeat("a", MaxContinuationBytes)}, true},
		{"empty text", Continuation{}, false},
		{"one byte over the bound", Continuation{Text: strings.Repeat("a", MaxContinuationBytes+1)}, false},
		{"invalid UTF-8", Continuation{Text: "ab\xffc"}, false},
		{"negative offset", Continuation{Text: "x", OffsetTokens: -1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Validate()
			if tc.ok {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrNotContinuable) || !errors.Is(err, ErrMalformedRequest) {
				t.Fatalf("Validate = %v, want ErrNotContinuable and ErrMalformedRequest", err)
			}
		})
	}
}

// The schema and the Go bound agree on every text a Go producer may send:
// the schema counts characters, which are never more than bytes.
func TestTheAttemptSchemaBoundsTheContinuationAsGoDoes(t *testing.T) {
	base := samples()[1].full.(Attempt)
	for _, tc := range []struct {
		name string
		text string
		ok   bool
	}{
		{"at the bound", strings.Repeat("a", MaxContinuationBytes), true},
		{"multi-byte text at the byte bound", strings.Repeat("é", MaxContinuationBytes/2), true},
		{"over the bound", strings.Repeat("a", MaxContinuationBytes+1), false},
		{"empty", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := base
			a.Continuation = &Continuation{Text: tc.text}
			goErr := a.Continuation.Validate()
			schemaErr := Validate(KindAttempt, mustMarshal(t, a))
			if (goErr == nil) != tc.ok || (schemaErr == nil) != tc.ok {
				t.Errorf("Go: %v; schema: %v; want valid = %v", goErr, schemaErr, tc.ok)
			}
		})
	}
}

func TestAnAttemptCarriesAContinuationExactlyWhenItsRoleIsContinuation(t *testing.T) {
	cont := &Continuation{Text: "Hello "}
	for _, tc := range []struct {
		name string
		role Role
		cont *Continuation
		ok   bool
	}{
		{"continuation with its text", RoleContinuation, cont, true},
		{"primary without one", RolePrimary, nil, true},
		{"continuation without its text", RoleContinuation, nil, false},
		{"hedge with a text", RoleHedge, cont, false},
		{"replacement with a text", RoleReplacement, cont, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := samples()[1].full.(Attempt)
			a.Role, a.Continuation = tc.role, tc.cont
			if err := Validate(KindAttempt, mustMarshal(t, a)); (err == nil) != tc.ok {
				t.Errorf("Validate = %v, want valid = %v", err, tc.ok)
			}
		})
	}
}

// An attempt without a continuation is the attempt older workers read: no
// new member appears on it.
func TestAnAttemptWithoutAContinuationEncodesAsBefore(t *testing.T) {
	m := toMap(t, mustMarshal(t, samples()[1].minimal))
	if _, ok := m["continuation"]; ok {
		t.Errorf("an attempt without a continuation encodes one: %v", m["continuation"])
	}
}

func TestOnlyAPlainTextAnswerIsContinuable(t *testing.T) {
	user := Message{Role: MessageUser, Content: TextContent("Tell me a story.")}
	plain := func() ChatRequest { return ChatRequest{Messages: []Message{user}, MaxTokens: 100} }
	for _, tc := range []struct {
		name   string
		change func(*ChatRequest)
		ok     bool
	}{
		{"plain text", func(*ChatRequest) {}, true},
		{"response_format text", func(r *ChatRequest) { r.ResponseFormat = json.RawMessage(`{"type":"text"}`) }, true},
		{"null tools", func(r *ChatRequest) { r.Tools = json.RawMessage(`null`) }, true},
		{"n of 1", func(r *ChatRequest) { r.Extra = map[string]json.RawMessage{"n": json.RawMessage(`1`)} }, true},
		{"tools", func(r *ChatRequest) { r.Tools = json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`) }, false},
		{"tool_choice alone", func(r *ChatRequest) { r.ToolChoice = json.RawMessage(`"none"`) }, false},
		{"json_schema", func(r *ChatRequest) {
			r.ResponseFormat = json.RawMessage(`{"type":"json_schema","json_schema":{"name":"x","schema":{}}}`)
		}, false},
		{"json_object", func(r *ChatRequest) { r.ResponseFormat = json.RawMessage(`{"type":"json_object"}`) }, false},
		{"n of 2", func(r *ChatRequest) { r.Extra = map[string]json.RawMessage{"n": json.RawMessage(`2`)} }, false},
		{"a final assistant message", func(r *ChatRequest) {
			r.Messages = append(r.Messages, Message{Role: MessageAssistant, Content: TextContent("Once")})
		}, false},
		{"embeddings", func(r *ChatRequest) {
			*r = ChatRequest{Embedding: &EmbeddingRequest{Input: []string{"x"}}}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := plain()
			tc.change(&r)
			err := r.Continuable()
			if tc.ok != (err == nil) {
				t.Fatalf("Continuable = %v, want ok = %v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrNotContinuable) {
				t.Errorf("Continuable = %v, want ErrNotContinuable", err)
			}
		})
	}
}
