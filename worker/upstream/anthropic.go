package upstream

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/hedgerow/hedgerow/schemas"
)

// AnthropicVersion is the anthropic-version header the adapter sends: the
// Messages API version whose shapes it reads.
const AnthropicVersion = "2023-06-01"

// DefaultAnthropicMaxTokens is the max_tokens sent for a request that sets
// no cap, since the Messages API requires one. It is large enough not to cut
// an ordinary answer; budgets reserve by the cohort's output, not by it.
const DefaultAnthropicMaxTokens = 4096

// AnthropicOptions configures the Anthropic Messages adapter of one route.
type AnthropicOptions struct {
	// Options is shared with the OpenAI adapter, except BaseURL's convention:
	// the API root as Anthropic's SDKs take it ("https://api.anthropic.com"),
	// to which the adapter appends "/v1/messages"; a root that already ends
	// in "/v1", as OpenAI-style routes are written, gets "/messages" only.
	// APIKey is sent as x-api-key.
	Options
	// MaxTokens is the max_tokens sent when the request sets none; 0 means
	// DefaultAnthropicMaxTokens.
	MaxTokens int
}

// Anthropic is the Upstream of an Anthropic Messages endpoint. It is safe
// for concurrent use.
type Anthropic struct {
	adapter
	maxTokens int
}

var _ Upstream = (*Anthropic)(nil)

// NewAnthropic returns an adapter for the route cfg describes.
func NewAnthropic(cfg AnthropicOptions) (*Anthropic, error) {
	u, err := parseBaseURL(cfg.BaseURL)
	if err != nil {
		return nil, fmt.Errorf("upstream: anthropic adapter: %w", err)
	}
	if cfg.MaxTokens < 0 {
		return nil, fmt.Errorf("upstream: anthropic adapter: default max_tokens %d is negative", cfg.MaxTokens)
	}
	style, err := checkStyle(cfg.Continuation, ContinuePrefill)
	if err != nil {
		return nil, fmt.Errorf("upstream: anthropic adapter: %w", err)
	}
	root := strings.TrimSuffix(cfg.BaseURL, "/")
	endpoint := root + "/v1/messages"
	if strings.HasSuffix(strings.TrimSuffix(u.Path, "/"), "/v1") {
		endpoint = root + "/messages"
	}
	ad := cfg.adapter(endpoint)
	ad.style = style
	return &Anthropic{
		adapter:   ad,
		maxTokens: cmp.Or(cfg.MaxTokens, DefaultAnthropicMaxTokens),
	}, nil
}

// Stream implements Upstream with one streaming POST to the Messages
// endpoint. As with the OpenAI adapter, the request is sent once and the
// provider is always streamed from, whatever the caller asked for.
func (a *Anthropic) Stream(ctx context.Context, req *schemas.ChatRequest, sink Sink) (Outcome, error) {
	if sink == nil {
		sink = discard{}
	}
	if err := ctx.Err(); err != nil {
		return Outcome{}, transportError(ctx, err) // nothing was sent
	}
	body, err := a.requestBody(req)
	if err != nil {
		return Outcome{}, unencodable(err)
	}
	return a.streamMessages(ctx, body, sink)
}

// streamMessages sends a Messages body and reads its stream into sink. As
// in the OpenAI adapter, a stream held open after message_stop can be cut
// without failing the attempt.
func (a *Anthropic) streamMessages(ctx context.Context, body []byte, sink Sink) (Outcome, error) {
	return a.stream(ctx, a.endpoint, body, a.setHeaders, newMessageStream(sink, inputEstimate(body)), "a stop reason")
}

// setHeaders sets the Messages API version and the route's key, if it has
// one.
func (a *Anthropic) setHeaders(h http.Header) {
	h.Set("Anthropic-Version", AnthropicVersion)
	if a.key != "" {
		h.Set("X-Api-Key", a.key)
	}
}
