package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// MaxContinuationBytes bounds Continuation.Text: the partial answer a
// continuation attempt carries beside its request. 256 KiB of text is
// tens of thousands of tokens, longer than the answers hedgerow rescues;
// a longer partial is not continued (docs/architecture.md §8).
const MaxContinuationBytes = 256 << 10

// Continuation asks a worker to continue an answer from partial output
// rather than answer the request from its start (issue 30): the
// dispatcher sends one with an attempt of role RoleContinuation when a
// committed stream broke after the caller had received Text. The worker
// builds its provider's continuation request from the attempt's request
// plus Text, in the style its route is configured for (prefill,
// continue_final_message or prefix), and streams only the text that
// follows Text (docs/architecture.md §6, "Continuation attempts").
//
// Text is model output the caller has seen: it is never logged, recorded
// or counted, like a prompt.
type Continuation struct {
	// Text is the assistant text already sent to the caller, exactly as
	// sent: 1 to MaxContinuationBytes bytes of UTF-8.
	Text string `json:"text"`
	// OffsetTokens is how many output tokens the broken attempt had
	// produced when it broke (its last chunk's cumulative_tokens): the
	// offset the continuation starts from. A worker lowers the request's
	// max_tokens by it, so the joined answer keeps to the cap the caller
	// asked for; 0 when unknown.
	OffsetTokens int64 `json:"offset_tokens,omitempty"`
}

// ErrNotContinuable is matched by every error Continuable and
// Continuation.Validate return: the request, or the continuation, cannot
// be continued on any route. It matches ErrMalformedRequest only when the
// continuation itself is malformed.
var ErrNotContinuable = errors.New("schemas: not continuable")

// Validate checks the continuation's bounds. Its errors match
// ErrNotContinuable and ErrMalformedRequest.
func (c *Continuation) Validate() error {
	switch {
	case c.Text == "":
		return fmt.Errorf("%w: %w: continuation text is empty (an attempt with nothing to continue is a replacement)", ErrNotContinuable, ErrMalformedRequest)
	case len(c.Text) > MaxContinuationBytes:
		return fmt.Errorf("%w: %w: continuation text of %d bytes is over %d", ErrNotContinuable, ErrMalformedRequest, len(c.Text), MaxContinuationBytes)
	case !utf8.ValidString(c.Text):
		return fmt.Errorf("%w: %w: continuation text is not valid UTF-8", ErrNotContinuable, ErrMalformedRequest)
	case c.OffsetTokens < 0:
		return fmt.Errorf("%w: %w: continuation offset_tokens %d is negative", ErrNotContinuable, ErrMalformedRequest, c.OffsetTokens)
	}
	return nil
}

// Continuable reports why the request's answer cannot be continued from
// partial output on any route, or nil if it can. Continuing splices a
// second model's text after the first's, which only plain text survives:
// tool calls (tools or tool_choice set), a structured answer (a
// response_format other than text: the provider's JSON mode constrains an
// answer from its start, and the joined JSON is judged whole), several
// choices (n > 1), an embeddings request, and a conversation that already
// ends with an assistant message (providers read it differently: a prefill
// to Anthropic, a finished turn to OpenAI) are refused. The dispatcher
// asks it before it starts a continuation; the worker asks again, since it
// trusts no sender. Errors match ErrNotContinuable and name the member,
// never its value.
func (r *ChatRequest) Continuable() error {
	refuse := func(why string) error { return fmt.Errorf("%w: %s", ErrNotContinuable, why) }
	switch {
	case r.Embedding != nil:
		return refuse("an embeddings request has no text to continue")
	case len(r.Messages) == 0:
		return refuse("the request has no messages")
	case !isAbsent(r.Tools) || !isAbsent(r.ToolChoice):
		return refuse("a request with tools or tool_choice is not continued")
	case !isTextFormat(r.ResponseFormat):
		return refuse("a request with a response_format other than text is not continued")
	case r.Messages[len(r.Messages)-1].Role == MessageAssistant:
		return refuse("a conversation that ends with an assistant message is not continued")
	}
	if n, ok := r.Extra["n"]; ok && !isNull(n) && string(bytes.TrimSpace(n)) != "1" {
		return refuse("a request for more than one choice (n) is not continued")
	}
	return nil
}

// isAbsent reports whether raw JSON is absent or null.
func isAbsent(raw json.RawMessage) bool { return len(bytes.TrimSpace(raw)) == 0 || isNull(raw) }

// isTextFormat reports whether a response_format is absent, null or
// {"type":"text"}.
func isTextFormat(raw json.RawMessage) bool {
	if isAbsent(raw) {
		return true
	}
	var head struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(raw, &head) == nil && head.Type == "text"
}
