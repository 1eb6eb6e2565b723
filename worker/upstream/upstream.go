package upstream

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// Upstream runs one attempt of a chat request against one provider route.
type Upstream interface {
	// Stream sends req to the provider once and reports the answer to sink
	// as it arrives: FirstByte once, at the first generated token, then one
	// Delta per content or tool-call chunk, in order, on the calling
	// goroutine. ctx bounds the whole call;
	// cancelling it closes the provider connection. A nil sink discards the
	// progress, for callers that want only the Outcome.
	//
	// The Outcome is returned with every error too: it holds what arrived
	// before the failure and the usage to settle for it. A non-nil error is
	// always an *Error.
	Stream(ctx context.Context, req *schemas.ChatRequest, sink Sink) (Outcome, error)
}

// Sink receives an attempt's progress while Stream runs. Its methods are
// called from Stream's goroutine and must not block for long: the provider
// connection is not read while they run.
type Sink interface {
	// FirstByte reports the first token the model generated, of any kind:
	// text, a refusal, a tool call's name, id or arguments, or reasoning.
	// It is the first-byte moment the hedge trigger, the delay estimator
	// and the guardrail measure (docs/architecture.md §4 rule 2). What a
	// provider sends before the model produces anything — the response
	// headers, an empty role chunk, Anthropic's message_start and ping, an
	// empty text block's start, SSE comments and keep-alives — is not
	// output: a stream that opens at once and then stalls is still
	// stalled. It is called at most once, before the first Delta, and never
	// for an error status or a stream that ends before any token.
	FirstByte()
	// Delta reports one chunk of output.
	Delta(Delta)
}

// Delta is the output of one provider chunk.
type Delta struct {
	// Content is the text this chunk added; empty for a tool-call chunk.
	Content string
	// ToolCalls is the chunk's raw tool-call deltas in the OpenAI shape: an
	// array of {index, id, type, function:{name, arguments}} fragments, of
	// which only index is always present. Nil when the chunk has none.
	ToolCalls json.RawMessage
	// Tokens is the number of output tokens this chunk is counted as (see
	// the package documentation).
	Tokens int
}

// Outcome is what one attempt produced and consumed.
type Outcome struct {
	// FinishReason is the provider's reason for stopping ("stop", "length",
	// "tool_calls", "content_filter", ...); empty if none arrived.
	FinishReason string
	// Usage is the provider's usage report, or an estimate flagged Estimated
	// when the stream did not deliver one.
	Usage schemas.Usage
	// Content is the accumulated answer text, for callers that did not ask
	// for a stream and for contract validation.
	Content string
	// Refusal is the accumulated text of a model's refusal, which OpenAI
	// streams apart from the content; it is never delivered as a Delta.
	Refusal string
	// ToolCalls is the accumulated tool calls as an OpenAI message carries
	// them: an array of {id, type, function:{name, arguments}} with the
	// argument fragments joined, ordered by index. Nil when there were none.
	ToolCalls json.RawMessage
	// Embeddings holds the vectors of an embeddings request, in input
	// order, as schemas.AttemptResult.Embeddings carries them.
	Embeddings json.RawMessage
	// WellFormed reports that every chunk parsed, a finish reason arrived
	// and the stream ended with [DONE].
	WellFormed bool
	// MaxTokenGap is the longest wait between two consecutive token
	// arrivals of the stream after the first token (pings, keep-alives and
	// empty deltas are no tokens); 0 when fewer than two tokens arrived or
	// the answer was not streamed (embeddings). The worker reports it, and
	// the dispatcher derives its cohort's stall bound from it
	// (docs/architecture.md §4 rule 4).
	MaxTokenGap time.Duration
}

// MaxRetryAfter bounds the Retry-After an Error reports.
const MaxRetryAfter = 24 * time.Hour

// Error is a failed attempt, classified for the hedge engine. Status and
// Scope say what happened and how far it reaches; Message is safe to record.
type Error struct {
	// Status is the coarse class of the failure.
	Status schemas.StatusClass
	// Scope is how far the failure reaches: group, route, transient,
	// pushback, or none for a cancellation by the caller.
	Scope schemas.ErrorScope
	// HTTPStatus is the provider's status; 0 when no response arrived or the
	// error came inside a 200 stream.
	HTTPStatus int
	// RetryAfter is how long the provider asked to be left alone; 0 when it
	// did not say.
	RetryAfter time.Duration
	// Message is a sanitized, bounded description: the provider's error
	// type, code and short message at most, never a body, header or key.
	Message string

	// cause is the underlying transport or decoding error, for errors.Is
	// (e.g. context.Canceled); it is not part of Error's text.
	cause error
}

// Error returns the status class, scope and sanitized message.
func (e *Error) Error() string {
	return fmt.Sprintf("upstream: %s (%s): %s", e.Status, e.Scope, e.Message)
}

// Unwrap returns the underlying cause, if any, so callers can match
// context.Canceled or network errors with errors.Is. Its text may name the
// endpoint URL; log Error's own text instead.
func (e *Error) Unwrap() error { return e.cause }

// discard is the Sink of callers that want only the Outcome.
type discard struct{}

func (discard) FirstByte()  {}
func (discard) Delta(Delta) {}
