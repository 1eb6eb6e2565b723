// Package frontdoor holds what every front door of hedgerow shares: the
// Submitter a door needs from the runtime, the one table that says how each
// failure is answered in each door's dialect, the header names callers and
// answers use, and the tenant keyring that authenticates callers.
//
// The doors themselves live below: frontdoor/httpdoor (OpenAI chat
// completions and Anthropic messages over HTTP) and frontdoor/natsdoor (the
// hedgerow.submit NATS micro service). A door reads a caller's request into a
// dispatcher.Submission, hands it to its Submitter and writes the answer or
// the failure back in its own dialect; it decides nothing about hedging.
package frontdoor

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor/tenantlimit"
)

// Submitter is what a front door needs from the runtime. *dispatcher.Dispatcher
// implements it; door tests script it.
type Submitter interface {
	// Submit runs one user action's request to its committed answer,
	// handing a streaming request's committed stream to sink as it arrives.
	// Cancelling ctx cancels the group with no fallback.
	Submit(ctx context.Context, sub dispatcher.Submission, sink dispatcher.Sink) (*dispatcher.Response, error)
	// NewGroupID reserves the id of the group a Submission with that
	// GroupID will run: the in-flight marker names it before it runs.
	NewGroupID() string
	// Pools lists the pools' own names.
	Pools() []string
	// Models lists every model name callers may send — each chat pool's
	// own name followed by its aliases — in the order GET /v1/models shows
	// them. A Submission may name its pool by any of them.
	Models() []dispatcher.Model
	// HasOperation says whether an operation class is configured: a door
	// refuses an unknown one rather than let it run under the default policy.
	HasOperation(class string) bool
	// CheckResponseFormat refuses, before any group runs, a response_format
	// the contract of the pool a model name names cannot honour. Errors match dispatcher.ErrUnknownPool,
	// or dispatcher.ErrBadRequest with arbiter.ErrInvalidContract (with a
	// *arbiter.SchemaBudgetError for a compile over its time or size
	// budget) or arbiter.ErrInvalidResponseFormat (with
	// arbiter.ErrSchemaLimit for a schema over the limits); ctx's error when
	// ctx ended the check. A schema it compiles is charged to tenant's share
	// of the compiled-schema cache (docs/architecture.md §6).
	CheckResponseFormat(ctx context.Context, tenant, pool string, responseFormat json.RawMessage) error
	// MaxTokens is the largest max_tokens a request naming model may ask
	// for (dispatcher.Pool.MaxTokens); 0 for an unknown model. Submit
	// refuses more with dispatcher.ErrMaxTokens; a door refuses it first,
	// naming its dialect's parameter.
	MaxTokens(model string) int
}

var _ Submitter = (*dispatcher.Dispatcher)(nil)

// TenantLimiter is what a door asks, once it knows the caller's tenant and
// before a group runs, whether the tenant's request rate and requests in
// flight allow one more (docs/architecture.md §2). *tenantlimit.Limiter
// implements it.
type TenantLimiter interface {
	// Admit admits one request of tenant, or refuses it with a
	// *tenantlimit.Refusal (answered with TenantLimited). An admitted
	// request calls release when it ends, on every path.
	Admit(ctx context.Context, tenant string) (release func(), err error)
}

var _ TenantLimiter = (*tenantlimit.Limiter)(nil)

// AdmitTenant applies l (nil: no limits) to one request of tenant: the
// release to defer, or the failure to answer. Neither door runs anything
// for a refused request.
func AdmitTenant(ctx context.Context, l TenantLimiter, tenant string) (release func(), f *Failure) {
	if l == nil {
		return func() {}, nil
	}
	release, err := l.Admit(ctx, tenant)
	if err == nil {
		return release, nil
	}
	if r, ok := errors.AsType[*tenantlimit.Refusal](err); ok {
		return nil, TenantLimited(r)
	}
	return nil, &Failure{Code: CodeInternal, Message: "The gateway failed to check the request's limits."}
}

// Headers of the front doors. Callers name the user action and the policy
// class and may shorten the deadline; answers say how they were won.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderOperation      = "X-Hedgerow-Operation"
	HeaderDeadlineMs     = "X-Hedgerow-Deadline-Ms"
	HeaderAttempts       = "X-Hedgerow-Attempts"
	HeaderHedged         = "X-Hedgerow-Hedged"
	HeaderWinnerRoute    = "X-Hedgerow-Winner-Route"
	HeaderGate           = "X-Hedgerow-Gate"
	// HeaderRequestID and HeaderXRequestID both carry the id of the group a
	// request runs as, on every answer of the HTTP door's API: the
	// Anthropic SDKs read request-id, the OpenAI SDKs x-request-id.
	HeaderRequestID  = "Request-Id"
	HeaderXRequestID = "X-Request-Id"
	// HeaderRegion names the region that committed the user action on a
	// committed_in_region refusal (docs/architecture.md §14).
	HeaderRegion = "X-Hedgerow-Region"
	// HeaderShouldRetry is the retry hint the official OpenAI and Anthropic
	// SDKs obey: "false" stops their automatic retries of an answer no retry
	// can change.
	HeaderShouldRetry = "X-Should-Retry"
	// HeaderIdempotentReplayed marks an answer replayed from the committed
	// answer of the same user action rather than produced again
	// (docs/architecture.md §2, Stripe's header).
	HeaderIdempotentReplayed = "Idempotent-Replayed"
	// HeaderTraceParent is the W3C trace context a caller may send on
	// either door; the group's trace continues it (docs/architecture.md §9).
	HeaderTraceParent = "traceparent"
)

// maxTraceParentLen bounds a traceparent header: version 00 is 55 bytes,
// later versions may append fields.
const maxTraceParentLen = 256

// TraceParent is a caller's traceparent header as the dispatcher takes it:
// the value, or empty when it is too long to be one. Its format is checked
// where it is read (the trace exporter), which starts a trace of its own
// for a malformed one.
func TraceParent(v string) string {
	if len(v) > maxTraceParentLen {
		return ""
	}
	return v
}

// Bounds of caller-chosen values: long enough for any sane use, short enough
// that they cannot make the gateway hash megabytes or overflow a deadline.
const (
	MaxIdempotencyKeyLen = 255
	MaxOperationLen      = 128
	// MaxDeadline bounds a caller's deadline; the dispatcher never lengthens
	// the policy's deadline anyway, so a larger value only risks overflow.
	MaxDeadline = 24 * time.Hour
)

// CallerDeadline is the deadline a caller asked for, in milliseconds, capped
// at MaxDeadline; zero or less asks for none.
func CallerDeadline(ms int64) time.Duration {
	if ms <= 0 {
		return 0
	}
	return time.Duration(min(ms, MaxDeadline.Milliseconds())) * time.Millisecond
}
