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
		}
		if json.Unmarshal(raw, &obj) != nil {
			return apiError{}, false
		}
		return apiError{Message: obj.Message, Type: obj.Type, Code: codeText(obj.Code)}, true
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

// codeText renders an error code that may be a JSON string or number.
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

// errorMessage builds Error.Message from what the provider said: status,
// type, code and its short message, sanitized, with the key redacted.
func errorMessage(status int, e apiError, key string) string {
	var b strings.Builder
	if status != 0 {
		fmt.Fprintf(&b, "HTTP %d", status)
	} else {
		b.WriteString("error event in stream")
	}
	for _, s := range []string{e.Type, e.Code} {
		if s != "" {
			b.WriteString(" ")
			b.WriteString(s)
		}
	}
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(redact(e.Message, key))
	}
	return schemas.SanitizeMessage(b.String())
}

// redact removes the configured key from provider text: providers echo a
// rejected key, sometimes in full.
func redact(s, key string) string {
	if key == "" {
		return s
	}
	return strings.ReplaceAll(s, key, "[redacted]")
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
