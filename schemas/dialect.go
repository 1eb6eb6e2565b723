package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Dialect is an API that a caller or a route speaks.
type Dialect string

// The dialects of hedgerow's front doors and provider adapters.
const (
	DialectOpenAI    Dialect = "openai"    // OpenAI chat completions
	DialectAnthropic Dialect = "anthropic" // Anthropic Messages
	// DialectResponses is OpenAI's Responses API. Routes of DialectOpenAI
	// speak it too: a request in it reaches them at the provider's
	// /responses with its members as sent, and Anthropic routes as
	// Messages (responsesToAnthropic).
	DialectResponses Dialect = "responses"
)

// Valid reports whether d is a dialect hedgerow speaks; empty counts as
// DialectOpenAI.
func (d Dialect) Valid() bool {
	return d == "" || d == DialectOpenAI || d == DialectAnthropic || d == DialectResponses
}

// api names the dialect for error messages.
func (d Dialect) api() string {
	switch d {
	case DialectAnthropic:
		return "the Anthropic Messages API"
	case DialectResponses:
		return "the OpenAI Responses API"
	}
	return "the OpenAI chat completions API"
}

// SourceDialect is the dialect the request's caller spoke: Dialect, or
// DialectOpenAI when it is empty.
func (r *ChatRequest) SourceDialect() Dialect {
	if r.Dialect == "" {
		return DialectOpenAI
	}
	return r.Dialect
}

// ErrUntranslatable is matched by every *UntranslatableError.
var ErrUntranslatable = errors.New("schemas: request member has no equivalent in the route's API")

// UntranslatableError names a member of a request that a route speaking To
// cannot receive: it has no equivalent there (logit_bias on Anthropic,
// top_k on OpenAI), or a value the route's API refuses. Doors answer it as
// a 400 naming Param; a worker answers it as a group-scoped invalid
// request, since every attempt of the group would fail alike.
type UntranslatableError struct {
	// Param is the member as the caller named it ("logit_bias",
	// "presence_penalty", "metadata").
	Param string
	// To is the dialect of the route that cannot receive it.
	To Dialect
	// Detail says why, when the member exists in both dialects but its
	// value does not translate; empty when the member has no equivalent.
	Detail string
}

// Error names the member and the API that lacks it.
func (e *UntranslatableError) Error() string {
	if e.Detail != "" {
		return fmt.Sprintf("'%s' cannot be sent to %s: %s", e.Param, e.To.api(), e.Detail)
	}
	return fmt.Sprintf("'%s' has no equivalent in %s", e.Param, e.To.api())
}

// Is makes errors.Is(err, ErrUntranslatable) hold.
func (e *UntranslatableError) Is(target error) bool { return target == ErrUntranslatable }

// Members each dialect's typed fields stand for, which Extra never holds:
// hedgerow owns model (mapped to the route's), messages, stream and
// stream_options (the worker always streams and asks for usage), and reads
// or translates the rest.
var (
	openAITyped = []string{"model", "messages", "stream", "stream_options", ParamMaxTokens, ParamMaxCompletionTokens,
		"temperature", "top_p", "presence_penalty", "frequency_penalty", "seed", "stop", "tools", "tool_choice",
		"response_format", "parallel_tool_calls"}
	anthropicTyped = []string{"model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p",
		"tools", "tool_choice", "stream"}
	// responsesTyped are the Responses members the door reads into typed
	// fields: input and instructions become messages, max_output_tokens
	// the output cap, text.format the response_format, stream_options is
	// the door's.
	responsesTyped = []string{"model", "input", "instructions", "max_output_tokens", "temperature", "top_p",
		"tools", "tool_choice", "parallel_tool_calls", "text", "stream", "stream_options"}
)

// ReservedParam reports whether Extra may not hold a member called name in
// the request's dialect: a typed field stands for it. The one exception is
// an OpenAI max_tokens superseded by max_completion_tokens, which is
// carried as sent.
func (r *ChatRequest) ReservedParam(name string) bool {
	switch r.SourceDialect() {
	case DialectAnthropic:
		return slices.Contains(anthropicTyped, name)
	case DialectResponses:
		return slices.Contains(responsesTyped, name)
	}
	if name == ParamMaxTokens && r.MaxTokensField == ParamMaxCompletionTokens {
		return false
	}
	return slices.Contains(openAITyped, name)
}

// validateExtra checks the dialect and the extra members: named, not
// standing for a typed field, valid JSON; an OpenAI n asks for one choice,
// the only one hedgerow reads.
func (r *ChatRequest) validateExtra() error {
	if !r.Dialect.Valid() {
		return fmt.Errorf("%w: unknown dialect %q", ErrMalformedRequest, r.Dialect)
	}
	for name, raw := range r.Extra {
		switch {
		case name == "":
			return fmt.Errorf("%w: extra member without a name", ErrMalformedRequest)
		case r.ReservedParam(name):
			return fmt.Errorf("%w: %s cannot be an extra member: it is a typed field", ErrMalformedRequest, name)
		case !json.Valid(raw):
			return fmt.Errorf("%w: %s is not valid JSON", ErrMalformedRequest, name)
		case name == "n" && r.SourceDialect() == DialectOpenAI && !isNull(raw) && string(bytes.TrimSpace(raw)) != "1":
			return fmt.Errorf("%w: n must be 1: only one choice is supported", ErrMalformedRequest)
		}
	}
	return nil
}

// ForDialect checks that a route speaking to can receive every member of
// the request, and returns the members beyond the typed fields it is sent:
// Extra itself when to is the caller's dialect (the caller must not modify
// it), else Extra translated. A member with no equivalent in to, or a value
// to refuses, is an *UntranslatableError; a malformed Extra matches
// ErrMalformedRequest. Members are checked in name order, so the error
// names the same member every time.
//
// The gateway calls it for every dialect of a pool's routes before a group
// runs; each adapter calls it again when it builds the provider's request.
// The table it implements is in docs/architecture.md §8.
func (r *ChatRequest) ForDialect(to Dialect) (map[string]json.RawMessage, error) {
	if r.Embedding != nil {
		return r.embeddingForDialect(to)
	}
	if err := r.validateExtra(); err != nil {
		return nil, err
	}
	if to == DialectAnthropic {
		if err := r.checkTypedForAnthropic(); err != nil {
			return nil, err
		}
	}
	from := r.SourceDialect()
	if from == DialectResponses && to == DialectOpenAI {
		if err := r.checkTypedForResponses(); err != nil {
			return nil, err
		}
	}
	if from == to || from == DialectResponses && to == DialectOpenAI || len(r.Extra) == 0 {
		return r.Extra, nil
	}
	translate := openAIToAnthropic
	switch from {
	case DialectAnthropic:
		translate = anthropicToOpenAI
	case DialectResponses:
		translate = responsesToAnthropic
	}
	out := make(map[string]json.RawMessage, len(r.Extra))
	for _, name := range r.ExtraNames() {
		raw := r.Extra[name]
		if isNull(raw) {
			continue // absent and null mean the same for an optional member
		}
		if err := translate(name, raw, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// checkChatOnlyTyped refuses, towards to, the typed fields only the Chat
// Completions API has: presence_penalty, frequency_penalty and seed, in
// that order, which neither the Messages nor the Responses API takes.
func (r *ChatRequest) checkChatOnlyTyped(to Dialect) error {
	for _, p := range []struct {
		name string
		set  bool
	}{
		{"presence_penalty", r.PresencePenalty != nil},
		{"frequency_penalty", r.FrequencyPenalty != nil},
		{"seed", r.Seed != nil},
	} {
		if p.set {
			return &UntranslatableError{Param: p.name, To: to}
		}
	}
	return nil
}

// checkTypedForAnthropic refuses the typed fields the Messages API has no
// equivalent for, or whose value it refuses.
func (r *ChatRequest) checkTypedForAnthropic() error {
	if err := r.checkChatOnlyTyped(DialectAnthropic); err != nil {
		return err
	}
	if r.Temperature != nil && *r.Temperature > 1 {
		return &UntranslatableError{Param: "temperature", To: DialectAnthropic, Detail: "it takes a temperature between 0 and 1"}
	}
	if rf := bytes.TrimSpace(r.ResponseFormat); len(rf) > 0 && !isNull(rf) {
		var head struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(rf, &head) != nil || head.Type != "text" {
			return &UntranslatableError{Param: "response_format", To: DialectAnthropic,
				Detail: "it has no JSON output mode (only {\"type\":\"text\"} translates)"}
		}
	}
	return nil
}

// openAIToAnthropic translates one OpenAI member into out for a Messages
// route: user becomes metadata.user_id; n 1, logprobs false, store false and
// a max_tokens superseded by max_completion_tokens change nothing and are
// left out; every other member is refused.
func openAIToAnthropic(name string, raw json.RawMessage, out map[string]json.RawMessage) error {
	lit := string(bytes.TrimSpace(raw))
	switch {
	case name == "user":
		var user string
		if json.Unmarshal(raw, &user) != nil {
			return &UntranslatableError{Param: name, To: DialectAnthropic, Detail: "user must be a string"}
		}
		md, _ := json.Marshal(struct {
			UserID string `json:"user_id"`
		}{user}) // a struct of a string always marshals
		out["metadata"] = md
		return nil
	case name == "n" && lit == "1", name == "logprobs" && lit == "false", name == "store" && lit == "false",
		name == ParamMaxTokens: // superseded: validateExtra admits it only beside max_completion_tokens
		return nil
	}
	return &UntranslatableError{Param: name, To: DialectAnthropic}
}

// anthropicToOpenAI translates one Messages member into out for an
// OpenAI-compatible route: metadata.user_id becomes user; thinking disabled
// changes nothing; every other member is refused.
func anthropicToOpenAI(name string, raw json.RawMessage, out map[string]json.RawMessage) error {
	switch name {
	case "metadata":
		var md map[string]json.RawMessage
		if json.Unmarshal(raw, &md) != nil {
			return &UntranslatableError{Param: name, To: DialectOpenAI, Detail: "metadata must be an object"}
		}
		for key, v := range md {
			if key != "user_id" {
				return &UntranslatableError{Param: name + "." + key, To: DialectOpenAI}
			}
			if isNull(v) {
				continue
			}
			if t := bytes.TrimSpace(v); len(t) == 0 || t[0] != '"' {
				return &UntranslatableError{Param: "metadata.user_id", To: DialectOpenAI, Detail: "user_id must be a string"}
			}
			out["user"] = v
		}
		return nil
	case "thinking":
		var th struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(raw, &th) == nil && th.Type == "disabled" {
			return nil
		}
	}
	return &UntranslatableError{Param: name, To: DialectOpenAI}
}

// ExtraNames lists the names of the request's extra members, sorted: what
// a diagnostic may show of them (never their values).
func (r *ChatRequest) ExtraNames() []string {
	names := make([]string, 0, len(r.Extra))
	for name := range r.Extra {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// knownParams are request member names of either API beyond the typed
// fields. Any other name is the caller's own text.
var knownParams = []string{
	"audio", "container", "logit_bias", "logprobs", "mcp_servers", "metadata", "modalities", "n", "prediction",
	"prompt_cache_key", "reasoning_effort", "safety_identifier", "service_tier", "store", "thinking", "top_k",
	"top_logprobs", "user", "verbosity", "web_search_options",
	// the Responses API's
	"background", "conversation", "include", "max_tool_calls", "previous_response_id", "prompt", "reasoning",
	"truncation",
}

// RecordableParam is what a message that may be logged or recorded (a
// worker's error) says of Param: the member's name when it is a typed field
// or a member of either API, "metadata" for a key of metadata, else empty:
// a name the caller made up is the caller's text, which never reaches logs
// or records (docs/architecture.md §9).
func (e *UntranslatableError) RecordableParam() string {
	name, _, nested := strings.Cut(e.Param, ".")
	switch {
	case nested && name == "metadata":
		return "metadata"
	case slices.Contains(knownParams, e.Param), slices.Contains(openAITyped, e.Param), slices.Contains(anthropicTyped, e.Param):
		return e.Param
	}
	return ""
}
