package schemas

import (
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

var hexFingerprint = regexp.MustCompile(`^[0-9a-f]{16}$`)

func TestPromptFingerprintIsStableKeyedAndOpaque(t *testing.T) {
	key := []byte("deployment-secret")
	for _, prompt := range []string{"", "Summarize this contract for me.", strings.Repeat("long prompt ", 1000), "p7f2"} {
		fp := PromptFingerprint(key, []byte(prompt))
		if !hexFingerprint.MatchString(fp) {
			t.Errorf("fingerprint %q is not %d hex digits", fp, PromptFingerprintLen)
		}
		if again := PromptFingerprint(key, []byte(prompt)); again != fp {
			t.Errorf("unstable: %q then %q", fp, again)
		}
		if other := PromptFingerprint([]byte("another-secret"), []byte(prompt)); other == fp {
			t.Errorf("a different key gives the same fingerprint %q", fp)
		}
		if prompt != "" && strings.Contains(fp, prompt) {
			t.Errorf("fingerprint %q contains the prompt", fp)
		}
	}
	if PromptFingerprint(key, []byte("a")) == PromptFingerprint(key, []byte("b")) {
		t.Error("different prompts share a fingerprint")
	}
}

func TestUserActionIDIsKeyedAndSeparatesTenants(t *testing.T) {
	key := []byte("deployment-secret")
	id := UserActionID(key, "acme", "order-2291")
	if !regexp.MustCompile(`^ua_[0-9a-f]{32}$`).MatchString(id) {
		t.Fatalf("id %q has the wrong form", id)
	}
	if strings.Contains(id, "order") || strings.Contains(id, "acme") {
		t.Errorf("id %q leaks its input", id)
	}
	for name, other := range map[string]string{
		"same input again":        UserActionID(key, "acme", "order-2291"),
		"another key":             UserActionID([]byte("other"), "acme", "order-2291"),
		"another tenant":          UserActionID(key, "globex", "order-2291"),
		"shifted tenant boundary": UserActionID(key, "acmeo", "rder-2291"),
	} {
		if same := other == id; same != (name == "same input again") {
			t.Errorf("%s: %q vs %q", name, other, id)
		}
	}
}

func TestSanitizeMessageRedactsCredentialsAndBoundsLength(t *testing.T) {
	for _, tc := range []struct {
		name, in  string
		mustNot   []string
		mustStill string
	}{
		{"api key", "Incorrect API key provided: sk-proj-abcDEF123456. Find your key in settings.", []string{"sk-proj", "abcDEF123456"}, "Incorrect API key provided"},
		{"bearer token", "upstream said: Authorization: Bearer eyJhbGciOi.payload.sig rejected", []string{"eyJhbGciOi"}, "rejected"},
		{"long opaque string", "request id 9f8e7d6c5b4a39281706f5e4d3c2b1a0ffeeddcc failed", []string{"9f8e7d6c5b4a"}, "failed"},
		{"error codes are kept", "invalid_request_error: context_length_exceeded_for_this_model_family", nil, "context_length_exceeded_for_this_model_family"},
		{"control characters", "line one\nline two\x00\x1b[31m", []string{"\n", "\x00", "\x1b"}, "line two"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := SanitizeMessage(tc.in)
			for _, s := range tc.mustNot {
				if strings.Contains(got, s) {
					t.Errorf("SanitizeMessage kept %q: %q", s, got)
				}
			}
			if !strings.Contains(got, tc.mustStill) {
				t.Errorf("SanitizeMessage lost %q: %q", tc.mustStill, got)
			}
		})
	}
	t.Run("length", func(t *testing.T) {
		got := SanitizeMessage(strings.Repeat("é overloaded ", 100))
		if len(got) > MaxErrorMessageLen || !utf8.ValidString(got) {
			t.Errorf("len %d, valid UTF-8 %v", len(got), utf8.ValidString(got))
		}
	})
}
