package schemas

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// PromptFingerprintLen is the length in hex digits of a prompt fingerprint:
// 64 bits, enough to correlate repeats of a prompt in records, too short to
// serve as a lookup key for guessing the prompt.
const PromptFingerprintLen = 16

// PromptFingerprint is the keyed hash (HMAC-SHA256, truncated hex) of a
// canonical prompt encoding. The key must be a secret of the deployment:
// without it, common prompts could be confirmed by hashing guesses.
func PromptFingerprint(key, canonical []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write(canonical)
	return hex.EncodeToString(mac.Sum(nil))[:PromptFingerprintLen]
}

// Fingerprint is the PromptFingerprint of the request's prompt: its messages,
// tools, tool choice and response format, without sampling parameters, so
// the same prompt sent with another temperature fingerprints the same. An
// embeddings request's prompt is its input texts (a chat request's
// fingerprint is unchanged by them).
func (r ChatRequest) Fingerprint(key []byte) (string, error) {
	var input []string
	if r.Embedding != nil {
		input = r.Embedding.Input
	}
	canonical, err := json.Marshal(struct {
		Messages       []Message       `json:"messages"`
		Tools          json.RawMessage `json:"tools,omitempty"`
		ToolChoice     json.RawMessage `json:"tool_choice,omitempty"`
		ResponseFormat json.RawMessage `json:"response_format,omitempty"`
		EmbeddingInput []string        `json:"embedding_input,omitempty"`
	}{r.Messages, r.Tools, r.ToolChoice, r.ResponseFormat, input})
	if err != nil {
		return "", fmt.Errorf("prompt fingerprint: %w", err)
	}
	return PromptFingerprint(key, canonical), nil
}

// UserActionID derives the opaque user action id that records, Redis keys
// and the winner gate use from a caller's idempotency key: "ua_" and 128 bits
// of HMAC-SHA256 over the tenant and the key. Callers' raw ids are user
// identifiers and must never be recorded; hashing with a deployment secret
// keeps them out of records while the same key still maps to the same
// action. The tenant is part of the input so two tenants' keys never share
// a gate.
func UserActionID(key []byte, tenant, callerKey string) string {
	mac := hmac.New(sha256.New, key)
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(tenant)))
	mac.Write(n[:]) // length prefix: ("ab","c") and ("a","bc") differ
	mac.Write([]byte(tenant))
	mac.Write([]byte(callerKey))
	return "ua_" + hex.EncodeToString(mac.Sum(nil)[:16])
}

// MaxErrorMessageLen bounds a sanitized error message in bytes.
const MaxErrorMessageLen = 256

// secretLike matches what may be a credential inside a provider's error
// text: API keys ("sk-..."), bearer tokens and long opaque strings.
var secretLike = regexp.MustCompile(`(?i)\bbearer\s+\S+|\b(?:sk|pk|rk|key|api)[-_][A-Za-z0-9_\-]{6,}|[A-Za-z0-9+/=_\-]{32,}`)

// SanitizeMessage makes a provider's error text fit for AttemptResult and
// logs: credential-like tokens are redacted, control characters removed and
// the text bounded to MaxErrorMessageLen bytes on a rune boundary. It cannot
// remove prompt text a provider echoes in prose, so adapters should prefer
// their own fixed descriptions and use this only for short provider codes
// and messages.
func SanitizeMessage(s string) string {
	s = strings.ToValidUTF8(s, "")
	s = secretLike.ReplaceAllStringFunc(s, func(m string) string {
		// Keys and tokens mix in digits; long snake_case error codes do not.
		if strings.HasPrefix(strings.ToLower(m), "bearer") || strings.ContainsAny(m, "0123456789") {
			return "[redacted]"
		}
		return m
	})
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	s = strings.TrimSpace(s)
	if len(s) <= MaxErrorMessageLen {
		return s
	}
	cut := MaxErrorMessageLen
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
