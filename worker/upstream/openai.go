package upstream

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// maxErrorBody bounds how much of an error answer is read: enough for any
// provider's error object, not enough for a misrouted page to cost memory.
const maxErrorBody = 64 << 10

// Options configures a provider adapter for one route.
type Options struct {
	// BaseURL is the API root including its version path, as the OpenAI SDKs
	// take it: "https://api.openai.com/v1" or "http://127.0.0.1:9101/v1". The
	// adapter appends "/chat/completions".
	BaseURL string
	// Model is the route's upstream model name; it replaces the model the
	// caller asked for. Empty keeps the request's model.
	Model string
	// APIKey is sent as "Authorization: Bearer <key>" when not empty. The
	// worker reads it from the environment variable the route names.
	APIKey string
	// Client overrides the HTTP client, e.g. to share a transport between
	// routes. It must not retry; the adapter disables redirects on its copy.
	// Nil uses a client of the adapter's own. Its Timeout should be 0: the
	// context bounds each call.
	Client *http.Client
	// Now is the clock that turns a Retry-After date into a duration; nil
	// uses time.Now.
	Now func() time.Time
	// StallAfterFirstToken bounds the wait for each next token once the
	// first one came: a stream silent that long after it is cut and fails
	// as a transient error, so the dispatcher may replace the attempt before
	// its commit, or end the committed stream with an error, instead of
	// waiting for the deadline (docs/architecture.md §4 rule 4). Zero means
	// DefaultStallAfterFirstToken; negative turns the bound off.
	StallAfterFirstToken time.Duration
	// Continuation is how the route's provider continues an answer from
	// partial output (Continue); empty or ContinueNone refuses every
	// continuation. The OpenAI adapter speaks ContinueFinalMessage and
	// ContinuePrefix, the Anthropic adapter ContinuePrefill.
	Continuation ContinuationStyle
}

// DefaultStallAfterFirstToken is the stall bound after the first token: a
// few times the inter-token gaps of the models hedgerow is measured on
// (tens of milliseconds), and short against the default 30 s deadline.
const DefaultStallAfterFirstToken = 2 * time.Second

// stallKey is the context key of WithStallAfterFirstToken.
type stallKey struct{}

// WithStallAfterFirstToken returns ctx carrying a stall bound for the calls
// made with it, which overrides the adapter's Options.StallAfterFirstToken:
// the worker passes the bound the attempt names
// (schemas.Attempt.StallAfterFirstTokenMs). A bound that is not positive
// leaves the adapter's.
func WithStallAfterFirstToken(ctx context.Context, d time.Duration) context.Context {
	if d <= 0 {
		return ctx
	}
	return context.WithValue(ctx, stallKey{}, d)
}

// stallBound is the stall bound of a call: the context's, else dflt.
func stallBound(ctx context.Context, dflt time.Duration) time.Duration {
	if d, ok := ctx.Value(stallKey{}).(time.Duration); ok {
		return d
	}
	return dflt
}

func (cfg Options) stallAfter() time.Duration {
	switch {
	case cfg.StallAfterFirstToken == 0:
		return DefaultStallAfterFirstToken
	case cfg.StallAfterFirstToken < 0:
		return 0
	}
	return cfg.StallAfterFirstToken
}

// OpenAI is the Upstream of an OpenAI-compatible Chat Completions endpoint.
// It is safe for concurrent use.
type OpenAI struct{ adapter }

var _ Upstream = (*OpenAI)(nil)

// NewOpenAI returns an adapter for the route cfg describes.
func NewOpenAI(cfg Options) (*OpenAI, error) {
	if _, err := parseBaseURL(cfg.BaseURL); err != nil {
		return nil, fmt.Errorf("upstream: openai adapter: %w", err)
	}
	style, err := checkStyle(cfg.Continuation, ContinueFinalMessage, ContinuePrefix)
	if err != nil {
		return nil, fmt.Errorf("upstream: openai adapter: %w", err)
	}
	ad := cfg.adapter(strings.TrimSuffix(cfg.BaseURL, "/") + "/chat/completions")
	ad.style = style
	return &OpenAI{ad}, nil
}

// adapter is what every provider adapter keeps of its Options, and what it
// does the same way whatever the provider.
type adapter struct {
	endpoint string
	model    string // empty: the request's
	key      string
	client   *http.Client
	now      func() time.Time
	stall    time.Duration // 0: no stall bound
	style    ContinuationStyle
}

// adapter is the state of an adapter of cfg that sends to endpoint.
func (cfg Options) adapter(endpoint string) adapter {
	return adapter{
		endpoint: endpoint,
		model:    cfg.Model,
		key:      cfg.APIKey,
		client:   cfg.httpClient(),
		now:      cfg.clock(),
		stall:    cfg.stallAfter(),
	}
}

// CloseIdleConnections closes the adapter's idle provider connections, for
// a worker shutting down.
func (ad *adapter) CloseIdleConnections() { ad.client.CloseIdleConnections() }

// translate begins every request body: it returns the caller's other
// members as dialect d carries them (schemas.ChatRequest.ForDialect, which
// refuses what has no equivalent) and the model to name, the route's or
// else the caller's.
func (ad *adapter) translate(req *schemas.ChatRequest, d schemas.Dialect) (extra map[string]json.RawMessage, model string, err error) {
	if req == nil {
		return nil, "", errors.New("no request")
	}
	if extra, err = req.ForDialect(d); err != nil {
		return nil, "", err
	}
	return extra, cmp.Or(ad.model, req.Model), nil
}

// stream sends body once as a streaming POST to endpoint (openStream) and
// folds the provider's events into s (readEvents, what being the finish a
// complete stream ends with), under the call's stall bound.
func (ad *adapter) stream(ctx context.Context, endpoint string, body []byte, setHeaders func(http.Header),
	s eventStream, what string) (Outcome, error) {
	ps, out, err := openStream(ctx, ad.client, endpoint, body, ad.now, setHeaders)
	if err != nil {
		return out, err
	}
	defer ps.close()
	ps.stallAfter = stallBound(ctx, ad.stall)
	return readEvents(ctx, ps, s, ad.now, what)
}

// parseBaseURL checks that a route's base_url is an absolute HTTP URL.
func parseBaseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("base_url %q: want an absolute http:// or https:// URL", raw)
	}
	return u, nil
}

// httpClient is the adapter's copy of the configured client, or a client of
// its own, that never follows a redirect.
func (cfg Options) httpClient() *http.Client {
	var client http.Client
	if cfg.Client != nil {
		client = *cfg.Client
	} else {
		t := http.DefaultTransport.(*http.Transport).Clone()
		// A worker keeps up to max_inflight attempts open to one host.
		t.MaxIdleConnsPerHost = 64
		client.Transport = t
	}
	// A redirected POST would be a second request the engine never sees.
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &client
}

func (cfg Options) clock() func() time.Time {
	if cfg.Now == nil {
		return time.Now
	}
	return cfg.Now
}

// Stream implements Upstream with one streaming POST to {base_url}/chat/completions,
// or to {base_url}/responses for a caller of the Responses API.
//
// The request is sent once (see openStream).
func (o *OpenAI) Stream(ctx context.Context, req *schemas.ChatRequest, sink Sink) (Outcome, error) {
	if sink == nil {
		sink = discard{}
	}
	if err := ctx.Err(); err != nil {
		return Outcome{}, transportError(ctx, err) // nothing was sent
	}
	if req != nil && req.Embedding != nil {
		return o.embed(ctx, req, sink) // embeddings.go
	}
	if req != nil && req.SourceDialect() == schemas.DialectResponses {
		return o.streamResponses(ctx, req, sink)
	}
	body, err := o.requestBody(req)
	if err != nil {
		return Outcome{}, unencodable(err)
	}
	return o.streamChat(ctx, body, sink)
}

// streamChat sends a Chat Completions body and reads its stream into sink.
func (o *OpenAI) streamChat(ctx context.Context, body []byte, sink Sink) (Outcome, error) {
	return o.stream(ctx, o.endpoint, body, o.authorize, chatStream{newAccumulator(sink, inputEstimate(body))}, "a finish reason")
}

// authorize sets the route's key as a bearer token, if it has one.
func (o *OpenAI) authorize(h http.Header) {
	if o.key != "" {
		h.Set("Authorization", "Bearer "+o.key)
	}
}

// chatStream reads a chat completions stream: chunks until [DONE].
type chatStream struct{ *accumulator }

func (s chatStream) event(typ, data []byte) (json.RawMessage, error) {
	switch {
	case string(data) == "[DONE]":
		s.done = true
		return nil, nil
	case string(typ) == "error":
		return bytes.Clone(data), nil
	}
	return s.chunk(data)
}

// ended reports that [DONE] arrived.
func (s chatStream) ended() bool { return s.done }

// Reading a body to its end lets the transport keep the connection for the
// next attempt, which saves a TLS handshake on the latency path. After its
// final event a provider should end the body at once; the drain waits at
// most drainWait and reads at most drainLimit bytes before giving up on
// reuse. drainWait is a variable so that a test can make it long.
var drainWait = 50 * time.Millisecond

const drainLimit = 4 << 10

// providerStream is a provider's 2xx event stream. Its request has a
// context of its own, which the attempt's context ends until the stream's
// final event detaches it: the rest of the body is then drained after the
// answer is reported, and a stream held open after its end is cut without
// failing the attempt.
type providerStream struct {
	resp      *http.Response
	cancel    context.CancelFunc // ends the request, closing its connection
	detach    func() bool        // stops the attempt's context from ending the request
	drainWait time.Duration
	drained   bool // a drain owns the body and the request
	// stallAfter bounds the silence between tokens after the first one
	// (Options.StallAfterFirstToken); 0 turns the bound off.
	stallAfter time.Duration
}

// drainAfterEnd reads what follows the final event in the background, so
// the answer is reported without waiting for the body to end, then releases
// the request, cut if the provider has not ended the body within drainWait.
// If the attempt's context has ended already, close cuts the request.
func (ps *providerStream) drainAfterEnd() {
	if !ps.detach() {
		return
	}
	ps.drained = true
	go func() {
		t := time.AfterFunc(ps.drainWait, ps.cancel)
		_, _ = io.Copy(io.Discard, io.LimitReader(ps.resp.Body, drainLimit))
		t.Stop()
		ps.resp.Body.Close()
		ps.cancel()
	}()
}

// close releases the stream unless a drain has taken it over.
func (ps *providerStream) close() {
	if ps.drained {
		return
	}
	ps.detach()
	ps.resp.Body.Close()
	ps.cancel()
}

// statusError classifies a non-2xx answer from its status, error body and
// headers; its message keeps none of the provider's text (errorMessage).
func statusError(resp *http.Response, now time.Time) *Error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	ae, _ := parseAPIError(raw)
	status, scope, wait := classifyStatus(resp.StatusCode, ae, resp.Header, now)
	return &Error{
		Status: status, Scope: scope, HTTPStatus: resp.StatusCode, RetryAfter: wait,
		Message: errorMessage(resp.StatusCode, status, ae),
	}
}

// unstreamedAnswer handles a 2xx JSON body where a stream was asked for:
// either a provider error wrapped in a success status, or an endpoint that
// ignores stream: true, which is a route that cannot serve hedged attempts.
func unstreamedAnswer(resp *http.Response, now time.Time) *Error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	if ae, ok := parseAPIError(raw); ok {
		status, scope, _ := classifyStatus(0, ae, resp.Header, now)
		return &Error{Status: status, Scope: scope, HTTPStatus: resp.StatusCode, Message: errorMessage(0, status, ae)}
	}
	return &Error{
		Status: schemas.StatusServerError, Scope: schemas.ScopeRoute, HTTPStatus: resp.StatusCode,
		Message: "provider answered with JSON instead of an event stream",
	}
}

// streamError classifies an error object sent inside a 200 stream.
func streamError(data []byte, now time.Time) *Error {
	ae, ok := parseAPIError(data)
	if !ok {
		// An error event whose data is not an error object still ends the
		// stream; say nothing of its text.
		return &Error{Status: schemas.StatusServerError, Scope: schemas.ScopeTransient, Message: "error event in stream"}
	}
	status, scope, _ := classifyStatus(0, ae, nil, now)
	return &Error{Status: status, Scope: scope, Message: errorMessage(0, status, ae)}
}

// malformed is the error of a stream that stopped being parseable.
func malformed(cause error) *Error {
	return &Error{
		Status: schemas.StatusServerError, Scope: schemas.ScopeTransient,
		Message: "malformed stream chunk", cause: cause,
	}
}

// chatCompletionRequest is the Chat Completions request body: the typed
// fields of the canonical request. Messages use schemas.Message as is: it
// already has OpenAI's JSON shape. The caller's other members are added by
// withMembers.
type chatCompletionRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	MaxTokens           int             `json:"max_tokens,omitempty"`
	MaxCompletionTokens int             `json:"max_completion_tokens,omitempty"`
	Temperature         *float64        `json:"temperature,omitempty"`
	TopP                *float64        `json:"top_p,omitempty"`
	PresencePenalty     *float64        `json:"presence_penalty,omitempty"`
	FrequencyPenalty    *float64        `json:"frequency_penalty,omitempty"`
	Seed                *int64          `json:"seed,omitempty"`
	Stop                []string        `json:"stop,omitempty"`
	Tools               json.RawMessage `json:"tools,omitempty"`
	ToolChoice          json.RawMessage `json:"tool_choice,omitempty"`
	ResponseFormat      json.RawMessage `json:"response_format,omitempty"`
	ParallelToolCalls   *bool           `json:"parallel_tool_calls,omitempty"`
	Stream              bool            `json:"stream"`
	StreamOptions       streamOptions   `json:"stream_options"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// chatMessage is a message as the request carries it: the canonical
// message, plus DeepSeek's prefix mark on a continuation's partial answer
// (continuation.go).
type chatMessage struct {
	schemas.Message
	Prefix bool `json:"prefix,omitempty"`
}

// requestBody translates the canonical request. The output cap goes in the
// member the caller named it by (max_completion_tokens for OpenAI's
// reasoning models; max_tokens otherwise, which compatible servers all
// read); the caller's other members follow as sent, or translated from an
// Anthropic caller's (schemas.ChatRequest.ForDialect, which refuses what has
// no equivalent). The model is the route's, and stream and stream_options
// are the worker's: it always streams and asks for usage. JSON nulls in raw
// typed fields are dropped, since some servers reject an explicit null
// where they accept an absent field; extra members are sent as the caller
// sent them.
func (o *OpenAI) requestBody(req *schemas.ChatRequest) ([]byte, error) {
	body, extra, err := o.chatRequest(req)
	if err != nil {
		return nil, err
	}
	return encodeChat(body, extra)
}

// chatRequest is requestBody before its encoding: the typed body and the
// caller's other members, which the caller must not modify.
func (o *OpenAI) chatRequest(req *schemas.ChatRequest) (chatCompletionRequest, map[string]json.RawMessage, error) {
	extra, model, err := o.translate(req, schemas.DialectOpenAI)
	if err != nil {
		return chatCompletionRequest{}, nil, err
	}
	msgs := make([]chatMessage, len(req.Messages))
	for i, m := range req.Messages {
		m.Content = dropNull(m.Content)
		m.ToolCalls = dropNull(m.ToolCalls)
		msgs[i] = chatMessage{Message: m}
	}
	body := chatCompletionRequest{
		Model:             model,
		Messages:          msgs,
		Temperature:       req.Temperature,
		TopP:              req.TopP,
		PresencePenalty:   req.PresencePenalty,
		FrequencyPenalty:  req.FrequencyPenalty,
		Seed:              req.Seed,
		Stop:              req.Stop,
		Tools:             dropNull(req.Tools),
		ToolChoice:        dropNull(req.ToolChoice),
		ResponseFormat:    dropNull(req.ResponseFormat),
		ParallelToolCalls: req.ParallelToolCalls,
		Stream:            true,
		StreamOptions:     streamOptions{IncludeUsage: true},
	}
	body.setOutputCap(req, req.MaxTokens)
	return body, extra, nil
}

// setOutputCap puts n in the member req names its cap by.
func (b *chatCompletionRequest) setOutputCap(req *schemas.ChatRequest, n int) {
	b.MaxTokens, b.MaxCompletionTokens = 0, 0
	if req.OutputCapParam() == schemas.ParamMaxCompletionTokens {
		b.MaxCompletionTokens = n
	} else {
		b.MaxTokens = n
	}
}

// encodeChat encodes a Chat Completions body with the members beyond its
// typed fields.
func encodeChat(body chatCompletionRequest, extra map[string]json.RawMessage) ([]byte, error) {
	out, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encode chat completion request: %w", err)
	}
	return withMembers(out, extra)
}

// withMembers adds members to the JSON object obj, in name order, each
// value as given (compacted). The caller guarantees that obj has no member
// of the same name (schemas.ChatRequest.ForDialect never returns one a
// typed field stands for).
func withMembers(obj []byte, members map[string]json.RawMessage) ([]byte, error) {
	if len(members) == 0 {
		return obj, nil
	}
	obj = bytes.TrimRight(obj, " \t\r\n")
	if len(obj) < 2 || obj[len(obj)-1] != '}' {
		return nil, errors.New("encode request: not a JSON object")
	}
	var b bytes.Buffer
	b.Grow(len(obj) + 64*len(members))
	b.Write(obj[:len(obj)-1])
	empty := len(bytes.TrimSpace(obj[1:len(obj)-1])) == 0
	names := make([]string, 0, len(members))
	for name := range members {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if !empty {
			b.WriteByte(',')
		}
		empty = false
		key, err := marshalNoEscape(name)
		if err != nil {
			return nil, fmt.Errorf("encode request member name: %w", err)
		}
		b.Write(key)
		b.WriteByte(':')
		if err := json.Compact(&b, members[name]); err != nil {
			return nil, fmt.Errorf("encode request member: %w", err)
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func dropNull(raw json.RawMessage) json.RawMessage {
	if t := bytes.TrimSpace(raw); len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return nil
	}
	return raw
}

// unencodable is the error of a request the adapter cannot encode for its
// provider: nothing was sent, and no route could send it either.
// A member with no equivalent at the provider is named in the message when
// it is a member of either API (schemas.UntranslatableError.RecordableParam).
func unencodable(err error) *Error {
	if ue, ok := errors.AsType[*schemas.UntranslatableError](err); ok {
		what := "a request member the caller named"
		if p := ue.RecordableParam(); p != "" {
			what = "request member '" + p + "'"
		}
		return &Error{
			Status: schemas.StatusInvalidRequest, Scope: schemas.ScopeGroup,
			Message: what + " has no equivalent at this provider", cause: err,
		}
	}
	return &Error{
		Status: schemas.StatusInvalidRequest, Scope: schemas.ScopeGroup,
		Message: "request cannot be encoded for the provider", cause: err,
	}
}

// inputEstimate is the input units a request body is settled at if the
// provider's usage report never arrives: a token per four bytes.
func inputEstimate(body []byte) int64 { return int64(len(body)+3) / 4 }

// openStream sends body once as a streaming POST to endpoint, with the
// adapter's own headers, and returns the provider's 2xx event stream; the
// caller closes it. An open stream is not yet a first byte: that is the
// first generated token the caller reads from it (Sink.FirstByte). On
// error, out holds what may have been billed.
//
// The only resend the Go transport may make is of a request it could not
// write at all to a reused idle connection, which the provider never saw.
func openStream(ctx context.Context, client *http.Client, endpoint string, body []byte, now func() time.Time,
	setHeaders func(http.Header)) (ps *providerStream, out Outcome, err error) {
	reqCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	detach := context.AfterFunc(ctx, cancel)
	release := func() {
		detach()
		cancel()
	}
	hreq, err := http.NewRequestWithContext(reqCtx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		release()
		return nil, Outcome{}, &Error{
			Status: schemas.StatusNotFound, Scope: schemas.ScopeRoute,
			Message: "provider request cannot be built", cause: err,
		}
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	setHeaders(hreq.Header)

	resp, err := client.Do(hreq)
	if err != nil {
		release()
		out, err := unsent(ctx, err, body)
		return nil, out, err
	}
	fail := func(err error) (*providerStream, Outcome, error) {
		resp.Body.Close()
		release()
		return nil, Outcome{}, err
	}
	if resp.StatusCode/100 != 2 {
		return fail(statusError(resp, now()))
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "application/json" {
		return fail(unstreamedAnswer(resp, now()))
	}
	return &providerStream{resp: resp, cancel: cancel, detach: detach, drainWait: drainWait}, Outcome{}, nil
}

// unsent is the outcome and error of a request body whose sending failed
// with err: billed at its estimate unless the connection was never made.
func unsent(ctx context.Context, err error, body []byte) (out Outcome, _ error) {
	if !neverConnected(err) {
		out.Usage = schemas.Usage{InputUnits: inputEstimate(body), Estimated: true}
	}
	return out, transportError(ctx, err)
}
