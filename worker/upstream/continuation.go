package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/hedgerow/hedgerow/schemas"
)

// ContinuationStyle is how a route's provider continues an answer from
// partial output (config's routes[].continuation): the adapter sends the
// partial text as the conversation's final assistant message, marked the
// way the provider's API asks, and the provider answers with what follows.
type ContinuationStyle string

// Continuation styles.
const (
	// ContinueNone: the route cannot continue (also the empty style).
	ContinueNone ContinuationStyle = "none"
	// ContinuePrefill is Anthropic's assistant prefill: the Messages
	// request ends with an assistant message holding the partial text
	// (Anthropic adapter only).
	ContinuePrefill ContinuationStyle = "prefill"
	// ContinueFinalMessage is vLLM's and SGLang's continue_final_message:
	// the partial text as a final assistant message, with
	// "continue_final_message": true and "add_generation_prompt": false
	// (OpenAI adapter only).
	ContinueFinalMessage ContinuationStyle = "continue_final_message"
	// ContinuePrefix is DeepSeek's prefix completion: the final assistant
	// message carries "prefix": true (OpenAI adapter only; DeepSeek serves
	// it at its beta base URL, which the route's base_url names).
	ContinuePrefix ContinuationStyle = "prefix"
)

// ErrCannotContinue is matched by the error of a continuation sent to a
// route whose adapter has no continuation style, or whose provider does
// not speak it: a route's configuration, not the request, is at fault.
var ErrCannotContinue = errors.New("route cannot continue")

// CannotContinue is the error of a continuation attempt on a route that
// cannot continue: an invalid request of scope route, so no other attempt
// is failed by it; it matches ErrCannotContinue. The worker returns it for
// an Upstream that has no Continue method.
func CannotContinue(why string) *Error {
	return &Error{
		Status: schemas.StatusInvalidRequest, Scope: schemas.ScopeRoute,
		Message: "continuation refused: " + why, cause: ErrCannotContinue,
	}
}

// NotContinuable is the error of a continuation attempt whose request or
// partial text cannot be continued on any route (err matches
// schemas.ErrNotContinuable; its text names members, never values): an
// invalid request of scope group, not retried. The dispatcher asks
// schemas.ChatRequest.Continuable before it sends one; the worker does
// not trust that it did.
func NotContinuable(err error) *Error {
	return &Error{
		Status: schemas.StatusInvalidRequest, Scope: schemas.ScopeGroup,
		Message: "continuation refused: " + strings.TrimPrefix(err.Error(), schemas.ErrNotContinuable.Error()+": "),
		cause:   err,
	}
}

// checkStyle checks, when an adapter is built, that its route's style is
// one its provider speaks; it returns the style with empty read as none.
func checkStyle(s ContinuationStyle, speaks ...ContinuationStyle) (ContinuationStyle, error) {
	if s == "" || s == ContinueNone {
		return ContinueNone, nil
	}
	for _, ok := range speaks {
		if s == ok {
			return s, nil
		}
	}
	switch s {
	case ContinuePrefill, ContinueFinalMessage, ContinuePrefix:
		return "", fmt.Errorf("continuation %q is not one this provider speaks", s)
	}
	return "", fmt.Errorf("continuation %q: want none, prefill, continue_final_message or prefix", s)
}

// continuation checks a continuation attempt before anything is sent: the
// adapter's style is want, the partial text is within its bounds, the
// request is one a splice can join, and there is output left under its
// max_tokens. It returns the output cap to send: max_tokens less the
// tokens already produced, 0 when the request set none.
func (ad *adapter) continuation(req *schemas.ChatRequest, from schemas.Continuation, want ...ContinuationStyle) (int, error) {
	if !ad.canContinue(want...) {
		return 0, CannotContinue("the route's continuation is " + string(ad.style))
	}
	if req == nil {
		return 0, NotContinuable(fmt.Errorf("%w: no request", schemas.ErrNotContinuable))
	}
	if err := from.Validate(); err != nil {
		return 0, NotContinuable(err)
	}
	if err := req.Continuable(); err != nil {
		return 0, NotContinuable(err)
	}
	if req.MaxTokens == 0 {
		return 0, nil
	}
	left := int64(req.MaxTokens) - from.OffsetTokens
	if left < 1 {
		return 0, NotContinuable(fmt.Errorf("%w: the partial answer holds max_tokens already", schemas.ErrNotContinuable))
	}
	return int(left), nil
}

func (ad *adapter) canContinue(want ...ContinuationStyle) bool {
	for _, s := range want {
		if ad.style == s {
			return true
		}
	}
	return false
}

// Continue implements the worker's continuation of an answer on an
// OpenAI-compatible route: the request as Stream sends it, plus the
// partial text as a final assistant message, which continue_final_message
// routes mark with "continue_final_message": true and
// "add_generation_prompt": false (overriding the caller's, if any) and
// prefix routes with "prefix": true on the message. The provider's text
// follows the partial text, so every delta is reported as it comes; usage
// is the continuation's own. max_tokens is lowered by the tokens already
// produced (Continuation.OffsetTokens).
//
// A Responses caller's request is sent at /responses, which has no
// continuation: it is refused (NotContinuable) — an Anthropic route can
// continue it.
func (o *OpenAI) Continue(ctx context.Context, req *schemas.ChatRequest, from schemas.Continuation, sink Sink) (Outcome, error) {
	if sink == nil {
		sink = discard{}
	}
	if err := ctx.Err(); err != nil {
		return Outcome{}, transportError(ctx, err) // nothing was sent
	}
	outputCap, err := o.continuation(req, from, ContinueFinalMessage, ContinuePrefix)
	if err != nil {
		return Outcome{}, err
	}
	if req.SourceDialect() == schemas.DialectResponses {
		return Outcome{}, NotContinuable(fmt.Errorf("%w: a Responses request is continued only on an anthropic route", schemas.ErrNotContinuable))
	}
	body, extra, err := o.chatRequest(req)
	if err != nil {
		return Outcome{}, unencodable(err)
	}
	body.Messages = append(body.Messages, chatMessage{
		Message: schemas.Message{Role: schemas.MessageAssistant, Content: schemas.TextContent(from.Text)},
		Prefix:  o.style == ContinuePrefix,
	})
	body.setOutputCap(req, outputCap)
	if o.style == ContinueFinalMessage {
		extra = maps.Clone(extra)
		if extra == nil {
			extra = map[string]json.RawMessage{}
		}
		extra["continue_final_message"] = json.RawMessage("true")
		extra["add_generation_prompt"] = json.RawMessage("false")
	}
	raw, err := encodeChat(body, extra)
	if err != nil {
		return Outcome{}, unencodable(err)
	}
	return o.streamChat(ctx, raw, sink)
}

// Continue implements the worker's continuation of an answer on an
// Anthropic route by assistant prefill: the request as Stream sends it,
// plus the partial text as the final assistant message. A request with
// extended thinking is refused, since the Messages API takes no prefill
// with it.
//
// The Messages API refuses a final assistant message that ends in white
// space, so the prefill is the partial text with its trailing white space
// W stripped, and the caller, who has received W already, must not get it
// twice nor lose it. The rule: the continuation's text is reported from
// the point where it stops repeating W — its longest prefix that is also
// a prefix of W is dropped (across deltas, however the provider splits
// it), and everything from the first character that differs is reported
// as it comes. So a model that restarts with W (" world" after a prefill
// "Hello" from "Hello ") yields "world", and one that does not ("world")
// yields all of it: either way the caller reads "Hello world", W once.
// Tokens and usage stay the provider's; Outcome.Content is the reported
// text. A partial that is all white space is sent without a prefill.
func (a *Anthropic) Continue(ctx context.Context, req *schemas.ChatRequest, from schemas.Continuation, sink Sink) (Outcome, error) {
	if sink == nil {
		sink = discard{}
	}
	if err := ctx.Err(); err != nil {
		return Outcome{}, transportError(ctx, err) // nothing was sent
	}
	outputCap, err := a.continuation(req, from, ContinuePrefill)
	if err != nil {
		return Outcome{}, err
	}
	if thinks(req) {
		return Outcome{}, NotContinuable(fmt.Errorf("%w: a request with extended thinking takes no prefill", schemas.ErrNotContinuable))
	}
	body, extra, err := a.messagesRequest(req)
	if err != nil {
		return Outcome{}, unencodable(err)
	}
	prefill := strings.TrimRightFunc(from.Text, unicode.IsSpace)
	if prefill != "" {
		text, err := marshalNoEscape(prefill)
		if err != nil {
			return Outcome{}, unencodable(err)
		}
		body.Messages = append(body.Messages, messagesMessage{Role: "assistant", Content: text})
	}
	if outputCap > 0 {
		body.MaxTokens = outputCap
	}
	raw, err := encodeMessages(body, extra)
	if err != nil {
		return Outcome{}, unencodable(err)
	}
	skip := &skipRepeat{Sink: sink, repeat: from.Text[len(prefill):]}
	out, err := a.streamMessages(ctx, raw, skip)
	out.Content = out.Content[min(skip.dropped, len(out.Content)):]
	return out, err
}

// thinks reports whether an Anthropic caller asked for extended thinking:
// a thinking member other than {"type":"disabled"}.
func thinks(req *schemas.ChatRequest) bool {
	raw, ok := req.Extra["thinking"]
	if !ok || dropNull(raw) == nil {
		return false
	}
	var th struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(raw, &th) != nil || th.Type != "disabled"
}

// skipRepeat is the Sink of a prefill continuation: it drops the start of
// the text that repeats what the prefill stripped (repeat), up to the
// first character that differs, and passes the rest on (see
// Anthropic.Continue). dropped counts the bytes dropped, which were the
// first bytes of the stream's text.
type skipRepeat struct {
	Sink
	repeat  string // what of the stripped white space is still unmatched
	done    bool   // a character differed, or the stripped text is matched
	dropped int
}

func (s *skipRepeat) Delta(d Delta) {
	if !s.done && d.Content != "" {
		n := commonPrefix(s.repeat, d.Content)
		s.repeat, s.dropped = s.repeat[n:], s.dropped+n
		d.Content = d.Content[n:]
		// Done once the whole of it repeated, or the delta went on past
		// the part that did.
		s.done = s.repeat == "" || d.Content != ""
	}
	s.Sink.Delta(d)
}

// commonPrefix is the length in bytes of the longest common prefix of a
// and b, in whole runes.
func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) {
		ra, sa := utf8.DecodeRuneInString(a[n:])
		rb, sb := utf8.DecodeRuneInString(b[n:])
		if ra != rb || sa != sb {
			break
		}
		n += sa
	}
	return n
}
