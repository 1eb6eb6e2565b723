package schemas

import (
	"encoding/json"
	"errors"
	"testing"
)

func TestChatRequestValidateRejectsMalformedRequests(t *testing.T) {
	user := Message{Role: MessageUser, Content: TextContent("hi")}
	with := func(edit func(*ChatRequest)) ChatRequest {
		r := ChatRequest{Messages: []Message{user}}
		edit(&r)
		return r
	}
	for _, tc := range []struct {
		name string
		req  ChatRequest
		// schemaRejects says the JSON Schema catches it too; the rest need
		// cross-field rules only Validate applies.
		schemaRejects bool
	}{
		{"no messages", ChatRequest{}, true},
		{"negative max_tokens", with(func(r *ChatRequest) { r.MaxTokens = -1 }), true},
		{"temperature above 2", with(func(r *ChatRequest) { r.Temperature = ptr(2.5) }), true},
		{"negative top_p", with(func(r *ChatRequest) { r.TopP = ptr(-0.1) }), true},
		{"presence penalty below -2", with(func(r *ChatRequest) { r.PresencePenalty = ptr(-3.0) }), true},
		{"empty stop sequence", with(func(r *ChatRequest) { r.Stop = []string{""} }), true},
		{"tools not an array", with(func(r *ChatRequest) { r.Tools = json.RawMessage(`{"type":"function"}`) }), true},
		{"tool_choice a number", with(func(r *ChatRequest) { r.ToolChoice = json.RawMessage(`3`) }), true},
		{"response_format a string", with(func(r *ChatRequest) { r.ResponseFormat = json.RawMessage(`"json"`) }), true},
		{"message without role", with(func(r *ChatRequest) { r.Messages = []Message{{Content: TextContent("x")}} }), true},
		{"unknown role", with(func(r *ChatRequest) { r.Messages = []Message{{Role: "robot", Content: TextContent("x")}} }), true},
		{"content a number", with(func(r *ChatRequest) { r.Messages = []Message{{Role: MessageUser, Content: json.RawMessage(`42`)}} }), true},
		{"part without type", with(func(r *ChatRequest) {
			r.Messages = []Message{{Role: MessageUser, Content: json.RawMessage(`[{"text":"x"}]`)}}
		}), true},
		{"text part without text", with(func(r *ChatRequest) {
			r.Messages = []Message{{Role: MessageUser, Content: json.RawMessage(`[{"type":"text"}]`)}}
		}), true},
		{"tool message without tool_call_id", with(func(r *ChatRequest) {
			r.Messages = []Message{user, {Role: MessageTool, Content: TextContent("{}")}}
		}), true},
		{"user message without content", with(func(r *ChatRequest) { r.Messages = []Message{{Role: MessageUser}} }), false},
		{"assistant null content without tool calls", with(func(r *ChatRequest) {
			r.Messages = []Message{user, {Role: MessageAssistant, Content: json.RawMessage(`null`)}}
		}), false},
		{"tool calls on a user message", with(func(r *ChatRequest) {
			r.Messages = []Message{{Role: MessageUser, Content: TextContent("x"), ToolCalls: json.RawMessage(`[]`)}}
		}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.req.Validate()
			if !errors.Is(err, ErrMalformedRequest) {
				t.Errorf("Validate() = %v, want ErrMalformedRequest", err)
			}
			data, err := json.Marshal(tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if schemaErr := Validate(KindChatRequest, data); tc.schemaRejects && schemaErr == nil {
				t.Errorf("schema accepted %s", data)
			}
		})
	}
}

func TestChatRequestValidateAcceptsWellFormedRequests(t *testing.T) {
	for name, req := range map[string]ChatRequest{
		"minimal": minimalChatRequest(),
		"full":    fullChatRequest(),
		"null raw fields": {
			Messages:       []Message{{Role: MessageUser, Content: TextContent("hi")}},
			Tools:          json.RawMessage(`null`),
			ToolChoice:     json.RawMessage(`null`),
			ResponseFormat: json.RawMessage(`null`),
		},
	} {
		t.Run(name, func(t *testing.T) {
			if err := req.Validate(); err != nil {
				t.Errorf("Validate() = %v", err)
			}
			data, _ := json.Marshal(req)
			if err := Validate(KindChatRequest, data); err != nil {
				t.Errorf("schema: %v", err)
			}
		})
	}
}

func TestMessagePartsNormalizesStringAndArrayContent(t *testing.T) {
	for _, tc := range []struct {
		name      string
		content   json.RawMessage
		wantTypes []string
		wantText  string
	}{
		{"string", TextContent("hello"), []string{"text"}, "hello"},
		{"parts", json.RawMessage(`[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]`),
			[]string{"text", "image_url", "text"}, "ab"},
		{"null", json.RawMessage(`null`), nil, ""},
		{"absent", nil, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := Message{Role: MessageUser, Content: tc.content}
			parts, err := m.Parts()
			if err != nil {
				t.Fatal(err)
			}
			var types []string
			for _, p := range parts {
				types = append(types, p.Type)
				if len(p.Raw) == 0 {
					t.Errorf("part %q lost its raw form", p.Type)
				}
			}
			if len(types) != len(tc.wantTypes) {
				t.Fatalf("types %v, want %v", types, tc.wantTypes)
			}
			for i := range types {
				if types[i] != tc.wantTypes[i] {
					t.Errorf("types %v, want %v", types, tc.wantTypes)
				}
			}
			if text, _ := m.Text(); text != tc.wantText {
				t.Errorf("Text() = %q, want %q", text, tc.wantText)
			}
		})
	}
}

func TestRequestFingerprintIgnoresSamplingParameters(t *testing.T) {
	key := []byte("deployment-secret")
	a := fullChatRequest()
	b := fullChatRequest()
	b.Temperature = ptr(1.5)
	b.MaxTokens = 9
	b.Stream = false
	fa, err := a.Fingerprint(key)
	if err != nil {
		t.Fatal(err)
	}
	fb, _ := b.Fingerprint(key)
	if fa != fb {
		t.Errorf("sampling parameters changed the fingerprint: %s vs %s", fa, fb)
	}
	b.Messages[0].Content = TextContent("You answer at length.")
	if fc, _ := b.Fingerprint(key); fc == fa {
		t.Error("a different prompt has the same fingerprint")
	}
}
