package fakellm

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"

	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// Continuation is the way a route continues an answer from partial
// assistant output, as real providers offer it. A route accepts only its
// own style; ContinuationNone behaves as a route did before continuation
// existed (the markers of every style are ignored, a trailing assistant
// message is part of the conversation).
type Continuation string

// The continuation styles.
const (
	ContinuationNone Continuation = "none"
	// ContinuationPrefill is Anthropic's assistant prefill: on POST
	// /v1/messages, a final assistant message is the start of the answer.
	// Content ending in whitespace is refused with 400, as Anthropic does.
	ContinuationPrefill Continuation = "prefill"
	// ContinuationFinalMessage is vLLM's and SGLang's continue_final_message
	// on POST /v1/chat/completions: with "continue_final_message": true and
	// "add_generation_prompt": false the final assistant message is the
	// start of the answer. add_generation_prompt defaults to true, so a
	// request that leaves it out is refused, as vLLM does.
	ContinuationFinalMessage Continuation = "continue_final_message"
	// ContinuationPrefix is DeepSeek's chat prefix completion on POST
	// /v1/chat/completions: a final assistant message with "prefix": true is
	// the start of the answer.
	ContinuationPrefix Continuation = "prefix"
)

// Continuations lists the styles a route can be started with, the default
// first.
var Continuations = []Continuation{ContinuationNone, ContinuationPrefill, ContinuationFinalMessage, ContinuationPrefix}

// ParseContinuation returns the style s names; empty is ContinuationNone.
func ParseContinuation(s string) (Continuation, error) {
	return parseName("continuation", s, Continuations)
}

// parseName returns the one of names that s is; empty is the first.
func parseName[T ~string](what, s string, names []T) (T, error) {
	if s == "" {
		return names[0], nil
	}
	for _, n := range names {
		if string(n) == s {
			return n, nil
		}
	}
	return "", fmt.Errorf("%w: %s %q is none of %v", ErrInvalidOptions, what, s, names)
}

// continuation is a request to continue the answer to the conversation
// before its final message, whose text is partial.
type continuation struct {
	style   Continuation
	partial string
}

// textSeed seeds the draw of an answer's length and input tokens. It is
// fixed, not the route's seed, so the full text of a request is the same
// whatever --seed, --route or stream: a continuation on any route can
// then finish what a route of another seed began.
const textSeed = 0

// textID keys an answer's text: the conversation alone. The output cap
// only truncates that text, as a real model's does, so a continuation
// whose cap counts only the new tokens continues the same text.
func textID(msgs []schemas.Message) (uint64, error) {
	return RequestID(msgs, 0)
}

// FullText is the whole answer the fake gives the chat conversation msgs
// with output cap maxTokens (0: none) on a route of model m: the same text
// on every route and seed, streamed or not, and what a continuation from
// any prefix of it joins up to. msgs are in the chat API's terms; an
// Anthropic request's system prompt is a leading system message and its
// text blocks text parts (string content stays a string).
func FullText(m *workload.Model, msgs []schemas.Message, maxTokens int) (string, error) {
	gen, err := workload.NewGenerator(m, textSeed)
	if err != nil {
		return "", fmt.Errorf("fakellm: full text: %w", err)
	}
	id, err := textID(msgs)
	if err != nil {
		return "", err
	}
	n := gen.Request(id).OutputTokens
	if maxTokens > 0 {
		n = min(n, maxTokens)
	}
	var b strings.Builder
	for k := 1; k <= n; k++ {
		b.WriteString(fillerToken(id, k))
	}
	return b.String(), nil
}

// answer is what an exchange sends: tokens skip+1 ... of the text keyed by
// textID, the first of them cut to head when a continuation's partial
// ended inside it.
type answer struct {
	textID uint64
	skip   int
	head   string
}

// token returns the exchange's output token k (1-based).
func (a answer) token(k int) string {
	if k == 1 && a.head != "" {
		return a.head
	}
	return fillerToken(a.textID, a.skip+k)
}

// continueFrom checks that partial is a prefix of the full text of textID,
// fullLen tokens long, and returns the answer that finishes it, with how
// many tokens of the full text the partial touched (a token it ends
// inside counts). The partial must match byte for byte: it may end
// anywhere, inside a word or on the space that starts the next one, and
// may be empty; it may not reorder, drop or change whitespace.
func continueFrom(id uint64, fullLen int, partial string) (answer, int, error) {
	a := answer{textID: id}
	rest := partial
	for k := 1; k <= fullLen && rest != ""; k++ {
		tok := fillerToken(id, k)
		if len(rest) < len(tok) {
			if !strings.HasPrefix(tok, rest) {
				return answer{}, 0, notPrefix(partial, len(partial)-len(rest))
			}
			a.head = tok[len(rest):]
			return a, k, nil
		}
		if !strings.HasPrefix(rest, tok) {
			return answer{}, 0, notPrefix(partial, len(partial)-len(rest))
		}
		rest = rest[len(tok):]
		a.skip = k
	}
	if rest != "" {
		return answer{}, 0, &requestError{param: "messages", code: errCodeInvalidParams, message: fmt.Sprintf(
			"The final assistant message (%d bytes) is longer than this conversation's whole answer (%d tokens); there is nothing to continue.",
			len(partial), fullLen)}
	}
	return a, a.skip, nil
}

// notPrefix is the refusal of a partial that the answer does not start
// with, naming where they part.
func notPrefix(partial string, at int) error {
	return &requestError{param: "messages", code: errCodeInvalidParams, message: fmt.Sprintf(
		"The final assistant message is not a prefix of this conversation's answer: they differ from byte %d (%q).",
		at, partial[at:min(len(partial), at+16)])}
}

// chatContinuation reads a chat request's continuation markers for a route
// of style: nil when the request is an ordinary one. A marker of another
// style is refused (the route does not continue that way); the route's own
// marker must be used as its provider requires.
func chatContinuation(body []byte, req *chatCompletionRequest, style Continuation) (*continuation, error) {
	if style == ContinuationNone {
		return nil, nil
	}
	var marks struct {
		Messages []struct {
			Prefix bool `json:"prefix"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &marks); err != nil {
		return nil, &requestError{code: errCodeInvalidBody, message: fmt.Sprintf("We could not parse the JSON body of your request: %v", err)}
	}
	last := len(req.Messages) - 1
	prefixed := -1
	for i, m := range marks.Messages {
		if m.Prefix {
			prefixed = i
		}
	}
	finalMessage := req.ContinueFinalMessage != nil && *req.ContinueFinalMessage
	switch {
	case prefixed >= 0 && style != ContinuationPrefix:
		return nil, wrongStyle(fmt.Sprintf("messages[%d].prefix", prefixed), ContinuationPrefix, style)
	case finalMessage && style != ContinuationFinalMessage:
		return nil, wrongStyle("continue_final_message", ContinuationFinalMessage, style)
	case prefixed >= 0 && (prefixed != last || req.Messages[last].Role != schemas.MessageAssistant):
		return nil, &requestError{param: fmt.Sprintf("messages[%d].prefix", prefixed), code: errCodeInvalidParams,
			message: "prefix may be set only on the last message, which must be an assistant message."}
	case finalMessage && (req.AddGenerationPrompt == nil || *req.AddGenerationPrompt):
		return nil, &requestError{param: "add_generation_prompt", code: errCodeInvalidParams,
			message: "Cannot set both `continue_final_message` and `add_generation_prompt` to True."}
	case finalMessage && req.Messages[last].Role != schemas.MessageAssistant:
		return nil, &requestError{param: "continue_final_message", code: errCodeInvalidParams,
			message: "continue_final_message needs the last message to be an assistant message to continue."}
	case prefixed < 0 && !finalMessage:
		return nil, nil
	}
	partial, err := partialText(req.Messages[last])
	if err != nil {
		return nil, &requestError{param: fmt.Sprintf("messages[%d].content", last), code: errCodeInvalidParams, message: err.Error()}
	}
	return &continuation{style: style, partial: partial}, nil
}

// messagesContinuation reads an Anthropic request's final assistant
// message, already canonical in msgs, for a route of style: on a prefill
// route it is a continuation, refused when it ends in whitespace as
// Anthropic refuses it; a route of another style refuses it; a route
// without one answers it as today, a new turn after it.
func messagesContinuation(msgs []schemas.Message, style Continuation) (*continuation, error) {
	last := msgs[len(msgs)-1]
	if style == ContinuationNone || last.Role != schemas.MessageAssistant {
		return nil, nil
	}
	if style != ContinuationPrefill {
		return nil, wrongStyle("messages", ContinuationPrefill, style)
	}
	partial, err := partialText(last)
	if err != nil {
		return nil, &requestError{param: "messages", code: errCodeInvalidParams, message: "messages: " + err.Error()}
	}
	if strings.TrimRightFunc(partial, unicode.IsSpace) != partial {
		return nil, &requestError{param: "messages", code: errCodeInvalidParams,
			message: "messages: final assistant content cannot end with trailing whitespace"}
	}
	return &continuation{style: style, partial: partial}, nil
}

// partialText is the text of the message a continuation continues: text
// only, since the fake's answers are.
func partialText(m schemas.Message) (string, error) {
	parts, err := m.Parts()
	if err != nil {
		return "", fmt.Errorf("the assistant message to continue: %w", err)
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("the assistant message to continue holds a %q part; only text can be continued", p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// wrongStyle refuses a continuation in a style the route does not offer.
func wrongStyle(param string, asked, offered Continuation) error {
	return &requestError{param: param, code: errCodeInvalidParams, message: fmt.Sprintf(
		"This route does not continue answers by %s; its continuation style is %s.", asked, offered)}
}
