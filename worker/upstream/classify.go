package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// apiError is the provider's error object: {"error": {"message", "type",
// "param", "code"}} in OpenAI's shape. Compatible servers vary, so code may
// be a string or a number and some put the fields at the top level.
type apiError struct {
	Message string
	Type    string
	Code    string
	Param   string
}

// parseAPIError reads an error body. It returns false if the body holds no
// recognizable error.
func parseAPIError(body []byte) (apiError, bool) {
	var top struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Code    json.RawMessage `json:"code"`
	}
	if json.Unmarshal(body, &top) != nil {
		return apiError{}, false
	}
	raw := bytes.TrimSpace(top.Error)
	switch {
	case len(raw) > 0 && raw[0] == '{':
		var obj struct {
			Message string          `json:"message"`
			Type    string          `json:"type"`
			Code    json.RawMessage `json:"code"`
			Param   json.RawMessage `json:"param"`
		}
		if json.Unmarshal(raw, &obj) != nil {
			return apiError{}, false
		}
		return apiError{Message: obj.Message, Type: obj.Type, Code: codeText(obj.Code), Param: codeText(obj.Param)}, true
	case len(raw) > 0 && raw[0] == '"':
		var msg string
		if json.Unmarshal(raw, &msg) != nil {
			return apiError{}, false
		}
		return apiError{Message: msg}, true
	case top.Message != "":
		// Only a message marks top-level fields as an error: a success
		// object may have a type too (an Anthropic message is "message").
		return apiError{Message: top.Message, Type: top.Type, Code: codeText(top.Code)}, true
	}
	return apiError{}, false
}

// codeText renders an error code (or param) that may be a JSON string or
// number.
func codeText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	return ""
}

// has reports whether the error's type or code is one of names.
func (e apiError) has(names ...string) bool {
	for _, n := range names {
		if e.Type == n || e.Code == n {
			return true
		}
	}
	return false
}

// Input-side refusals and size limits that every route would give: the
// request, not the route, is at fault.
var groupCodes = []string{"context_length_exceeded", "content_filter", "content_policy_violation", "string_above_max_length"}

// classifyStatus maps a provider's error answer to a status class, scope
// and Retry-After, following the table in the package documentation.
// status is 0 for an error that arrived inside a 200 stream.
func classifyStatus(status int, e apiError, h http.Header, now time.Time) (schemas.StatusClass, schemas.ErrorScope, time.Duration) {
	if e.has("model_not_found") {
		return schemas.StatusNotFound, schemas.ScopeRoute, 0
	}
	switch {
	case status == 0:
		return classifyInStream(e)
	case status == http.StatusBadRequest, status == http.StatusRequestEntityTooLarge, status == http.StatusUnprocessableEntity:
		return schemas.StatusInvalidRequest, schemas.ScopeGroup, 0
	case status == http.StatusUnauthorized, status == http.StatusPaymentRequired, status == http.StatusForbidden:
		return schemas.StatusAuth, schemas.ScopeRoute, 0
	case status == http.StatusNotFound, status == http.StatusMethodNotAllowed:
		return schemas.StatusNotFound, schemas.ScopeRoute, 0
	case status == http.StatusRequestTimeout, status == http.StatusGatewayTimeout:
		return schemas.StatusTimeout, schemas.ScopeTransient, 0
	case status == http.StatusConflict:
		return schemas.StatusServerError, schemas.ScopeTransient, 0
	case status == http.StatusTooManyRequests:
		if e.has("insufficient_quota") {
			return schemas.StatusRateLimited, schemas.ScopeRoute, 0
		}
		return schemas.StatusRateLimited, schemas.ScopePushback, retryAfter(h, now)
	case status == 529:
		return schemas.StatusOverloaded, schemas.ScopePushback, retryAfter(h, now)
	case status == http.StatusServiceUnavailable && hasRetryAfter(h):
		return schemas.StatusOverloaded, schemas.ScopePushback, retryAfter(h, now)
	case status >= 500:
		return schemas.StatusServerError, schemas.ScopeTransient, 0
	case status >= 400:
		return schemas.StatusInvalidRequest, schemas.ScopeRoute, 0
	}
	return schemas.StatusNotFound, schemas.ScopeRoute, 0 // 3xx: base_url points at a redirect
}

// classifyInStream classifies an error sent inside a 200 stream, which has
// only the provider's error type and code to go by.
func classifyInStream(e apiError) (schemas.StatusClass, schemas.ErrorScope, time.Duration) {
	switch {
	case e.has("invalid_request_error", "request_too_large") || e.has(groupCodes...):
		return schemas.StatusInvalidRequest, schemas.ScopeGroup, 0
	case e.has("authentication_error", "permission_error", "invalid_api_key", "billing_error"):
		return schemas.StatusAuth, schemas.ScopeRoute, 0
	case e.has("not_found_error"):
		return schemas.StatusNotFound, schemas.ScopeRoute, 0
	case e.has("timeout_error"):
		return schemas.StatusTimeout, schemas.ScopeTransient, 0
	case e.has("insufficient_quota"):
		return schemas.StatusRateLimited, schemas.ScopeRoute, 0
	case e.has("rate_limit_error", "rate_limit_exceeded"):
		return schemas.StatusRateLimited, schemas.ScopePushback, 0
	case e.has("overloaded_error", "server_is_overloaded", "overloaded"):
		return schemas.StatusOverloaded, schemas.ScopePushback, 0
	}
	return schemas.StatusServerError, schemas.ScopeTransient, 0
}

func hasRetryAfter(h http.Header) bool {
	return h.Get("Retry-After") != "" || h.Get("Retry-After-Ms") != ""
}

// retryAfter reads retry-after-ms (milliseconds) or else Retry-After
// (delay-seconds or an HTTP date, measured from now). Unparsable or past
// values give 0: the provider named no usable time.
func retryAfter(h http.Header, now time.Time) time.Duration {
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil {
			return clampRetryAfter(ms * float64(time.Millisecond))
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseFloat(v, 64); err == nil {
		return clampRetryAfter(secs * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil {
		return clampRetryAfter(float64(t.Sub(now)))
	}
	return 0
}

func clampRetryAfter(ns float64) time.Duration {
	switch {
	case math.IsNaN(ns) || ns <= 0:
		return 0
	case ns >= float64(MaxRetryAfter):
		return MaxRetryAfter
	}
	return time.Duration(ns)
}

// errorMessage builds Error.Message from a provider's error answer keeping
// only what cannot carry the request's input or a credential
// (docs/architecture.md §9): the HTTP status, the error type and code when
// they are in the providers' published vocabulary (knownErrorNames), the
// top-level request member the error names (knownParams), and a fixed
// description of the failure class from our own table. The provider's free
// text is never kept — providers echo prompts, keys and headers in it — only
// its length, so an operator can tell that the provider said more. Unknown
// codes, types and params are dropped whole, never truncated or redacted:
// anything outside the vocabulary may be input.
func errorMessage(status int, class schemas.StatusClass, e apiError) string {
	var b strings.Builder
	if status != 0 {
		fmt.Fprintf(&b, "HTTP %d", status)
	} else {
		b.WriteString("error event in stream")
	}
	var dropped bool
	for _, s := range []string{e.Type, e.Code} {
		switch {
		case s == "":
		case knownErrorNames[s]:
			b.WriteString(" ")
			b.WriteString(s)
		default:
			dropped = true
		}
	}
	if p := paramRoot(e.Param); p != "" {
		fmt.Fprintf(&b, " (param %s)", p)
	} else if e.Param != "" {
		dropped = true
	}
	b.WriteString(": ")
	b.WriteString(classText[class])
	if classText[class] == "" {
		b.WriteString("the provider reported an error")
	}
	if e.Message != "" {
		fmt.Fprintf(&b, "; provider message withheld (%d bytes)", len(e.Message))
	}
	if dropped {
		b.WriteString("; unrecognized error fields withheld")
	}
	return b.String()
}

// classText describes each failure class a provider's answer can be
// classified as, in our words.
var classText = map[schemas.StatusClass]string{
	schemas.StatusInvalidRequest: "the provider refused the request as invalid",
	schemas.StatusAuth:           "the provider refused the route's credentials or access",
	schemas.StatusNotFound:       "the provider does not know the model or endpoint",
	schemas.StatusRateLimited:    "the provider's rate limit or quota was reached",
	schemas.StatusOverloaded:     "the provider is overloaded",
	schemas.StatusTimeout:        "the provider timed out",
	schemas.StatusServerError:    "the provider failed",
}

// knownErrorNames are the error types and codes OpenAI, Anthropic and
// common compatible servers publish. Only these are copied into messages:
// a provider may put anything in these fields, a key or the prompt among it.
var knownErrorNames = setOf(
	// types
	"invalid_request_error", "authentication_error", "permission_error", "not_found_error",
	"request_too_large", "rate_limit_error", "api_error", "overloaded_error", "billing_error",
	"timeout_error", "server_error", "insufficient_quota", "requests", "tokens",
	"request_forbidden", "invalid_request", "internal_error", "service_unavailable",
	// codes
	"context_length_exceeded", "content_filter", "content_policy_violation", "string_above_max_length",
	"model_not_found", "invalid_api_key", "rate_limit_exceeded", "server_is_overloaded", "overloaded",
	"unsupported_country_region_territory", "invalid_value", "invalid_type", "missing_required_parameter",
	"unknown_parameter", "unsupported_parameter", "unsupported_value", "integer_above_max_value",
	"integer_below_min_value", "array_above_max_length", "array_below_min_length", "invalid_prompt",
	"invalid_organization", "account_deactivated", "model_not_available", "engine_overloaded",
	"invalid_model", "max_tokens_exceeded", "tokens_exceeded", "quota_exceeded", "billing_hard_limit_reached",
	"400", "401", "403", "404", "408", "409", "413", "422", "429", "500", "502", "503", "504", "529",
)

// knownParams are the top-level request members a provider's error param
// may name (Chat Completions, Messages, Embeddings).
var knownParams = setOf(
	"messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "n",
	"stream", "stream_options", "stop", "stop_sequences", "presence_penalty", "frequency_penalty",
	"logit_bias", "logprobs", "top_logprobs", "user", "tools", "tool_choice", "parallel_tool_calls",
	"response_format", "seed", "system", "metadata", "input", "encoding_format", "dimensions",
	"service_tier", "reasoning_effort", "modalities", "audio", "prediction", "store", "thinking", "prompt",
)

func setOf(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// paramRoot is the known top-level member a param path starts with
// ("messages" of "messages[2].content"), or "" when it names none.
func paramRoot(param string) string {
	root := param
	if i := strings.IndexAny(root, ".["); i >= 0 {
		root = root[:i]
	}
	if knownParams[root] {
		return root
	}
	return ""
}

// transportError classifies a failure to get or read a response. The
// context is consulted first: a cancellation by the caller is not a failure
// of the route, and a passed deadline is a timeout however the transport
// happened to report it. Messages are fixed texts, because transport errors
// name the endpoint URL.
func transportError(ctx context.Context, err error) *Error {
	e := &Error{Status: schemas.StatusServerError, Scope: schemas.ScopeTransient, cause: err}
	if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
		e.cause = errors.Join(ctxErr, err) // so errors.Is(err, context.Canceled) holds
	}
	var netErr net.Error
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		e.Status, e.Scope, e.Message = schemas.StatusCanceled, schemas.ScopeNone, "canceled by the caller"
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		e.Status, e.Message = schemas.StatusTimeout, "attempt deadline passed"
	case errors.As(err, &netErr) && netErr.Timeout():
		e.Status, e.Message = schemas.StatusTimeout, "network timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		e.Message = "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		e.Message = "connection reset"
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		e.Message = "connection closed before the answer ended"
	default:
		e.Message = "transport error"
	}
	return e
}

// neverConnected reports whether err means no connection to the provider
// was made, so the request cannot have been billed.
func neverConnected(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
