package frontdoor

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor/tenantlimit"
	"github.com/hedgerow/hedgerow/schemas"
)

// Dialect is the protocol a door answers in. A failure has one status in
// every dialect, except where a dialect's clients expect another for the
// same condition (Anthropic's 529 overloaded).
type Dialect int

const (
	OpenAI    Dialect = iota // OpenAI-compatible HTTP
	Anthropic                // Anthropic Messages over HTTP
	NATS                     // the hedgerow.submit micro service (its error code header)
)

// StatusClientClosedRequest is nginx's 499: the caller went away before the
// answer. Nothing reaches the caller; it is for access logs.
const StatusClientClosedRequest = 499

// StatusOverloaded is Anthropic's 529: the service has no capacity now.
const StatusOverloaded = 529

// Codes of the failures the doors refuse on their own, before a group runs.
// The codes of a group's failures are schemas.ErrorCode's.
const (
	CodeInvalidValue     = "invalid_value"
	CodeInvalidJSON      = "invalid_json"
	CodeInvalidBody      = "invalid_body"
	CodeRequestTooLarge  = "request_too_large"
	CodeHeadersTooLarge  = "request_header_fields_too_large"
	CodeInvalidAPIKey    = "invalid_api_key"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeUnknownURL       = "unknown_url"
	CodeModelNotFound    = "model_not_found"
	CodeShuttingDown     = "shutting_down"
	CodeInternal         = "internal_error"
	// CodeIdempotencyKeyReused refuses an Idempotency-Key already used by
	// another request (another body, dialect or path) of the same tenant
	// (docs/architecture.md §2, §3).
	CodeIdempotencyKeyReused = "idempotency_key_reused"
	// CodeAnswerNotKept refuses a retry of a request whose answer was
	// delivered whole but was too large for the replay store: it cannot be
	// replayed, and running it again would commit the user action twice
	// (docs/architecture.md §2).
	CodeAnswerNotKept = string(schemas.ErrAnswerNotKept)
	// CodeCommittedInRegion refuses a retry of a user action another
	// region committed whose answer is not here: running it again would
	// commit it twice, and the region that committed it answers a retry
	// (docs/architecture.md §14, "User actions across regions").
	CodeCommittedInRegion = string(schemas.ErrCommittedInRegion)
	// CodeTenantRateLimited and CodeTenantConcurrencyLimited refuse a
	// request over its tenant's request rate or requests in flight
	// (frontdoor/tenantlimit, docs/architecture.md §2).
	CodeTenantRateLimited        = string(schemas.ErrTenantRateLimited)
	CodeTenantConcurrencyLimited = string(schemas.ErrTenantConcurrencyLimited)
)

// CodePermissionDenied refuses an authenticated caller whose tenant may not
// do what it asked (read the records report, docs/architecture.md §9).
const CodePermissionDenied = "permission_denied"

// OpenAI error types: clients branch on the status, and on the code for the
// details.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeAuthentication = "authentication_error"
	TypeRateLimit      = "rate_limit_error"
	TypeQuota          = "insufficient_quota"
	TypeTimeout        = "timeout_error"
	TypeServer         = "server_error"
)

// failureKind is one row of the error table: what a code means in every
// dialect.
type failureKind struct {
	status     int               // the HTTP status, and the NATS door's error code header
	openAIType string            // the OpenAI error object's type
	wire       schemas.ErrorCode // the code the NATS door sends
	retry      bool              // whether the same request sent again may succeed (X-Should-Retry)
}

// failureKinds is the one error table every door answers from. Status
// choices: every route failing transiently, or none being healthy, is 503 —
// the gateway works and already retried across the pool, so the condition is
// "no capacity now", which is what 503 tells clients and load balancers.
// Every route failing permanently (its credentials, its model) is 502: the
// upstreams answered, unusably, and a retry will not change that. Budget
// exhaustion is 429 insufficient_quota: an automatic retry of the same
// request cannot refill a ceiling.
var failureKinds = map[string]failureKind{
	CodeInvalidValue:                     {http.StatusBadRequest, TypeInvalidRequest, schemas.ErrInvalidRequest, false},
	CodeInvalidJSON:                      {http.StatusBadRequest, TypeInvalidRequest, schemas.ErrInvalidRequest, false},
	CodeInvalidBody:                      {http.StatusBadRequest, TypeInvalidRequest, schemas.ErrInvalidRequest, false},
	CodeRequestTooLarge:                  {http.StatusRequestEntityTooLarge, TypeInvalidRequest, schemas.ErrInvalidRequest, false},
	CodeHeadersTooLarge:                  {http.StatusRequestHeaderFieldsTooLarge, TypeInvalidRequest, schemas.ErrInvalidRequest, false},
	CodeInvalidAPIKey:                    {http.StatusUnauthorized, TypeAuthentication, schemas.ErrUnauthenticated, false},
	CodePermissionDenied:                 {http.StatusForbidden, TypeInvalidRequest, schemas.ErrUnauthenticated, false},
	CodeMethodNotAllowed:                 {http.StatusMethodNotAllowed, TypeInvalidRequest, schemas.ErrInvalidRequest, false},
	CodeUnknownURL:                       {http.StatusNotFound, TypeInvalidRequest, schemas.ErrInvalidRequest, false},
	CodeModelNotFound:                    {http.StatusNotFound, TypeInvalidRequest, schemas.ErrUnknownModel, false},
	CodeShuttingDown:                     {http.StatusServiceUnavailable, TypeServer, schemas.ErrUnavailable, true},
	CodeInternal:                         {http.StatusInternalServerError, TypeServer, schemas.ErrUnavailable, true},
	string(schemas.ErrInvalidRequest):    {http.StatusBadRequest, TypeInvalidRequest, schemas.ErrInvalidRequest, false},
	string(schemas.ErrUnknownModel):      {http.StatusNotFound, TypeInvalidRequest, schemas.ErrUnknownModel, false},
	string(schemas.ErrUnavailable):       {http.StatusServiceUnavailable, TypeServer, schemas.ErrUnavailable, true},
	string(schemas.ErrDeadlineExceeded):  {http.StatusGatewayTimeout, TypeTimeout, schemas.ErrDeadlineExceeded, true},
	string(schemas.ErrAlreadyCommitted):  {http.StatusConflict, TypeInvalidRequest, schemas.ErrAlreadyCommitted, false},
	string(schemas.ErrRateLimited):       {http.StatusTooManyRequests, TypeRateLimit, schemas.ErrRateLimited, true},
	string(schemas.ErrOverloaded):        {http.StatusTooManyRequests, TypeRateLimit, schemas.ErrOverloaded, true},
	string(schemas.ErrBudgetExhausted):   {http.StatusTooManyRequests, TypeQuota, schemas.ErrBudgetExhausted, false},
	string(schemas.ErrRouteFailed):       {http.StatusBadGateway, TypeServer, schemas.ErrRouteFailed, false},
	string(schemas.ErrAllRoutesFailed):   {http.StatusServiceUnavailable, TypeServer, schemas.ErrAllRoutesFailed, true},
	string(schemas.ErrNoRoute):           {http.StatusServiceUnavailable, TypeServer, schemas.ErrNoRoute, true},
	string(schemas.ErrNoWorkers):         {http.StatusServiceUnavailable, TypeServer, schemas.ErrNoWorkers, true},
	string(schemas.ErrStreamInterrupted): {http.StatusBadGateway, TypeServer, schemas.ErrStreamInterrupted, true},
	string(schemas.ErrGateUnavailable):   {http.StatusServiceUnavailable, TypeServer, schemas.ErrGateUnavailable, true},
	string(schemas.ErrCanceled):          {StatusClientClosedRequest, TypeInvalidRequest, schemas.ErrCanceled, false},
	CodeIdempotencyKeyReused:             {http.StatusConflict, TypeInvalidRequest, schemas.ErrInvalidRequest, false},
	CodeAnswerNotKept:                    {http.StatusConflict, TypeInvalidRequest, schemas.ErrAnswerNotKept, false},
	CodeCommittedInRegion:                {http.StatusConflict, TypeInvalidRequest, schemas.ErrCommittedInRegion, false},
	CodeTenantRateLimited:                {http.StatusTooManyRequests, TypeRateLimit, schemas.ErrTenantRateLimited, true},
	CodeTenantConcurrencyLimited:         {http.StatusTooManyRequests, TypeRateLimit, schemas.ErrTenantConcurrencyLimited, true},
}

// Failure is how a door answers one failure, in any dialect: the code names
// its row of the error table, which gives the status and types. Messages
// are fixed texts or name only what the caller got wrong: they never echo
// prompts, keys or headers.
type Failure struct {
	Code    string
	Param   string
	Message string
	// RetryAfter, when positive, is when a retry can succeed (Retry-After).
	RetryAfter time.Duration
	// NoRetry tells clients that retrying the same request cannot succeed
	// (X-Should-Retry: false, which the official SDKs obey) where the
	// failure's row alone would allow a retry.
	NoRetry bool
	// Holder is the gate value of the committed winner (already_committed).
	Holder string
	// Group is the failed group's id, as its records name it.
	Group string
	// Region names the region that committed the user action
	// (committed_in_region): a retry there is answered.
	Region string
}

func (f *Failure) kind() failureKind {
	if k, ok := failureKinds[f.Code]; ok {
		return k
	}
	return failureKinds[CodeInternal]
}

// Status is the failure's status in a dialect.
func (f *Failure) Status(d Dialect) int {
	status := f.kind().status
	if d == Anthropic && (f.Code == string(schemas.ErrNoRoute) || f.Code == string(schemas.ErrOverloaded)) {
		// Every route is paused or quarantined, or every worker stayed at
		// its in-flight limit: Anthropic clients back off on 529 overloaded.
		return StatusOverloaded
	}
	return status
}

// OpenAIType is the type of the failure's OpenAI error object.
func (f *Failure) OpenAIType() string { return f.kind().openAIType }

// WireCode is the stable code the NATS door sends for the failure.
func (f *Failure) WireCode() schemas.ErrorCode { return f.kind().wire }

// ShouldRetry is the X-Should-Retry hint of the failure: false when the
// same request cannot succeed again (NoRetry, or its row says so), true
// when it may (a Retry-After says when).
func (f *Failure) ShouldRetry() bool {
	if f.NoRetry {
		return false
	}
	return f.RetryAfter > 0 || f.kind().retry
}

// RetryAfterHeader is the Retry-After value of the failure: whole seconds,
// rounded up; empty when there is none.
func (f *Failure) RetryAfterHeader() string {
	if f.RetryAfter <= 0 {
		return ""
	}
	return strconv.FormatInt(int64((f.RetryAfter+time.Second-1)/time.Second), 10)
}

// InvalidParam is a 400 about one parameter of the request.
func InvalidParam(param, message string) *Failure {
	return &Failure{Code: CodeInvalidValue, Param: param, Message: message}
}

// FailureFor maps an error of Submitter.Submit to its answer; nil means the
// caller went away and nothing is to be sent.
func FailureFor(err error) *Failure {
	var ge *dispatcher.GroupError
	switch {
	case errors.Is(err, context.Canceled):
		return nil
	case errors.Is(err, dispatcher.ErrUnknownPool):
		return ModelNotFound(unknownPool(err))
	case errors.Is(err, dispatcher.ErrBadRequest):
		if f := SchemaRefused(err); f != nil {
			return f
		}
		if errors.Is(err, dispatcher.ErrMaxTokens) {
			return InvalidParam("max_tokens", "'max_tokens' is over the model's limit: "+badRequestMessage(err))
		}
		if ue, ok := errors.AsType[*schemas.UntranslatableError](err); ok {
			return untranslatable(ue)
		}
		return &Failure{Code: string(schemas.ErrInvalidRequest), Message: badRequestMessage(err)}
	case errors.Is(err, dispatcher.ErrShuttingDown):
		return &Failure{Code: CodeShuttingDown, RetryAfter: time.Second,
			Message: "This gateway is shutting down; retry on another replica."}
	case errors.As(err, &ge):
		return groupFailure(ge)
	}
	return &Failure{Code: CodeInternal, Message: "The gateway failed to serve the request."}
}

// ParamResponseSchema is where a request's JSON schema sits in every
// dialect that takes one as response_format.
const ParamResponseSchema = "response_format.json_schema.schema"

// SchemaRefused is the answer to a response_format schema refused for its
// cost (arbiter.ErrSchemaLimit: over the size, depth or container limits,
// refused before it was parsed; *arbiter.SchemaBudgetError: its compile
// ran past the time budget or its compiled form past the size budget), a
// 400 naming the schema and the limit; nil for any other error.
func SchemaRefused(err error) *Failure {
	if be, ok := errors.AsType[*arbiter.SchemaBudgetError](err); ok {
		return InvalidParam(ParamResponseSchema, fmt.Sprintf(
			"The JSON schema in 'response_format.json_schema.schema' is over this gateway's %s budget of %s per schema; send a smaller or simpler schema.",
			be.Budget, be.Limit))
	}
	switch {
	case errors.Is(err, arbiter.ErrSchemaLimit):
		return InvalidParam(ParamResponseSchema, fmt.Sprintf(
			"The JSON schema in 'response_format.json_schema.schema' is over the limits: at most %d bytes, %d levels of nested objects and arrays, %d objects and arrays, numbers within 1e±%d.",
			arbiter.MaxSchemaBytes, arbiter.MaxSchemaDepth, arbiter.MaxSchemaContainers, arbiter.MaxSchemaExponent))
	case errors.Is(err, arbiter.ErrCompileAborted):
		return InvalidParam(ParamResponseSchema,
			"The JSON schema in 'response_format.json_schema.schema' is too complex: it could not be compiled within the time limit.")
	}
	return nil
}

// MaxTokensOver is the answer to a request whose output limit, sent as
// param, is over the model's limit (Submitter.MaxTokens).
func MaxTokensOver(param string, limit int) *Failure {
	return InvalidParam(param, fmt.Sprintf("'%s' must be at most %d for this model.", param, limit))
}

// TenantLimited is the answer to a request its tenant's limits refused
// (frontdoor/tenantlimit): a 429 with the time a retry may be admitted.
func TenantLimited(r *tenantlimit.Refusal) *Failure {
	after := max(r.RetryAfter, time.Millisecond)
	if r.Reason == tenantlimit.ReasonConcurrency {
		return &Failure{Code: CodeTenantConcurrencyLimited, RetryAfter: after,
			Message: fmt.Sprintf("Your requests in flight are at this API key's limit of %g; retry when one ends.", r.Limit)}
	}
	return &Failure{Code: CodeTenantRateLimited, RetryAfter: after,
		Message: fmt.Sprintf("Your request rate is over this API key's limit of %g per second; retry after the Retry-After delay.", r.Limit)}
}

// IdempotencyKeyReused is the answer to an Idempotency-Key that names
// another request of the tenant: a 409 no retry of the same request can
// change (docs/architecture.md §2).
func IdempotencyKeyReused() *Failure {
	return &Failure{Code: CodeIdempotencyKeyReused, Param: HeaderIdempotencyKey,
		Message: "This Idempotency-Key was already used with another request; send a new key for a new request."}
}

// AnswerNotKept is the answer to a retry of a request whose answer was
// delivered whole but not kept for replay (too large, or the store full):
// a 409 at once, with no provider call, that no retry of the same request
// can change (docs/architecture.md §2).
func AnswerNotKept() *Failure {
	return &Failure{Code: CodeAnswerNotKept, Param: HeaderIdempotencyKey,
		Message: "The request of this Idempotency-Key was answered and its answer delivered, but it was not kept (too large, or the replay store was full), so it cannot be sent again; send a new key to run the request anew."}
}

// CommittedInRegion is the answer to a retry of a user action region
// committed, whose answer is not here: a 409 naming the region, where the
// same request is answered (replayed). Sent again here it is refused again
// (X-Should-Retry false) until that region has been unheard for
// global.rerun_after (docs/architecture.md §14).
func CommittedInRegion(region string) *Failure {
	return &Failure{Code: CodeCommittedInRegion, Param: HeaderIdempotencyKey, Region: region,
		Message: fmt.Sprintf("The request of this Idempotency-Key was committed in region %s, whose answer is not kept in this region; retry it in region %s, where it is answered.", region, region)}
}

// ModelNotFound is the answer to a model that names no pool.
func ModelNotFound(model string) *Failure {
	msg := "The model does not exist: it names no pool of this gateway."
	if model != "" {
		msg = "The model " + strconv.Quote(model) + " does not exist: it names no pool of this gateway."
	}
	return &Failure{Code: CodeModelNotFound, Param: "model", Message: msg}
}

// unknownPool is the pool an ErrUnknownPool error names, as the dispatcher
// quoted it.
func unknownPool(err error) string {
	_, quoted, ok := strings.Cut(err.Error(), dispatcher.ErrUnknownPool.Error()+": ")
	if !ok {
		return ""
	}
	if pool, err := strconv.Unquote(quoted); err == nil {
		return pool
	}
	return ""
}

// untranslatable answers a request member that a route of the model
// cannot receive (docs/architecture.md §8): a 400 naming it.
func untranslatable(ue *schemas.UntranslatableError) *Failure {
	return InvalidParam(ue.Param, "A route of this model cannot take this request: "+ue.Error()+
		". Leave the parameter out, or name a model whose routes all take it.")
}

// badRequestMessage says what is wrong with a request the dispatcher
// refused. A contract's compiler messages can quote the caller's schema, so
// those get a fixed text.
func badRequestMessage(err error) string {
	if errors.Is(err, arbiter.ErrInvalidContract) || errors.Is(err, arbiter.ErrInvalidResponseFormat) {
		return "The request's response_format cannot be honoured."
	}
	detail := strings.ReplaceAll(err.Error(), dispatcher.ErrBadRequest.Error()+": ", "")
	detail = strings.ReplaceAll(detail, schemas.ErrMalformedRequest.Error()+": ", "")
	return "The request is invalid: " + detail + "."
}

// allRoutesFailedMessage says why a request failed all_routes_failed or
// no_route: every route of the model was tried or is unhealthy, or the
// request's attempts were spent (docs/architecture.md §4 rule 4).
func allRoutesFailedMessage(ge *dispatcher.GroupError) string {
	switch {
	case ge.Code == schemas.ErrNoRoute:
		return "No route of the model is healthy now (every one is ejected, quarantined, in pushback or without a worker)."
	case ge.Refused == dispatcher.RefusedMaxAttempts:
		return "Every attempt this request may make (max_attempts) failed before a valid answer; other routes of the model were not tried."
	case ge.Refused == dispatcher.RefusedNoRoute:
		return "Every route of the model was tried or is unhealthy, and none produced a valid answer."
	case ge.Refused == dispatcher.RefusedNoTime:
		return "The routes tried failed too close to the deadline for another attempt."
	case ge.Refused != "":
		return "The routes tried failed, and no further attempt was allowed (" + ge.Refused + ")."
	}
	return "No route of the model could produce a valid answer."
}

func groupFailure(ge *dispatcher.GroupError) *Failure {
	f := &Failure{Code: string(ge.Code), Group: ge.Group}
	switch ge.Code {
	case schemas.ErrCanceled:
		return nil
	case schemas.ErrDeadlineExceeded:
		f.Message = "No valid answer arrived before the deadline."
	case schemas.ErrAlreadyCommitted:
		f.Holder, f.NoRetry = ge.Holder, true
		f.Message = "Another request of this user action (Idempotency-Key) already committed an answer: " + ge.Holder + "."
	case schemas.ErrRateLimited:
		// The longest pause the routes asked for, at least a second.
		f.RetryAfter = max(ge.RetryAfter, time.Second)
		f.Message = "Every route of the model is asking for less load; retry later."
	case schemas.ErrOverloaded:
		// The pool's workers stayed full for the whole queue wait
		// (docs/architecture.md §4 rule 4): waiting is the remedy.
		f.RetryAfter = max(ge.RetryAfter, time.Second)
		f.Message = "Every worker of the model is at its in-flight limit; retry later."
	case schemas.ErrGateUnavailable:
		f.RetryAfter = max(ge.RetryAfter, time.Second)
		f.Message = "The winner gate cannot decide now, so nothing was committed; retry later."
	case schemas.ErrBudgetExhausted:
		if ge.RetryAfter > 0 {
			// The tenant's spend window refused, or the user action's
			// attempt ledger is full after a death (docs/architecture.md
			// §7): it lapses after RetryAfter, and then admits the retry.
			f.RetryAfter = ge.RetryAfter
			f.Message = "The budget is exhausted for now — the tenant's spend window, or the attempts of a user action that met a gateway's or worker's death; retry after the Retry-After delay."
		} else {
			f.NoRetry = true
			f.Message = "The attempt or spend budget of this user action is exhausted."
		}
	case schemas.ErrRouteFailed:
		f.Message = "Every route of the model failed permanently (credentials or model at the provider)."
	case schemas.ErrAllRoutesFailed, schemas.ErrNoRoute:
		// Retryable: routes recover (ejections and pushback lapse), and a
		// client told when backs off instead of retrying at once.
		f.RetryAfter = max(ge.RetryAfter, time.Second)
		f.Message = allRoutesFailedMessage(ge)
	case schemas.ErrNoWorkers:
		// The pool's workers are gone or not started; other pools answer.
		// Workers come back on their own (a restart, a rollout).
		f.Param, f.RetryAfter = "model", max(ge.RetryAfter, time.Second)
		f.Message = fmt.Sprintf("No live worker serves the pool '%s' now, so nothing was sent to a provider; other models answer. Retry later.", ge.Pool)
	case schemas.ErrStreamInterrupted:
		f.Message = "The answer's stream broke after it began, so none of it counts as delivered; retry with the same Idempotency-Key."
	case schemas.ErrInvalidRequest:
		f.Message = "The request was refused as invalid: a provider rejected it, or its spend estimate (max_tokens, prompt size) is out of the budget's range."
	default:
		return &Failure{Code: CodeInternal, Group: ge.Group, Message: "The request failed."}
	}
	return f
}
