package upstream

import (
	"context"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

func TestErrorStatusesAreClassifiedIntoScopes(t *testing.T) {
	for _, tc := range []struct {
		name           string
		status         int
		body           string // fixture name, or "" for an empty body
		header         map[string]string
		wantStatus     schemas.StatusClass
		wantScope      schemas.ErrorScope
		wantRetryAfter time.Duration
		wantMessage    string
	}{
		{name: "400 context_length_exceeded ends the group", status: 400, body: "error_400_context_length.json",
			wantStatus: schemas.StatusInvalidRequest, wantScope: schemas.ScopeGroup, wantMessage: "context_length_exceeded"},
		{name: "400 invalid_request_error ends the group", status: 400, body: "error_400_invalid_request.json",
			wantStatus: schemas.StatusInvalidRequest, wantScope: schemas.ScopeGroup, wantMessage: "invalid_request_error"},
		{name: "400 content_policy_violation input refusal ends the group", status: 400, body: "error_400_content_policy.json",
			wantStatus: schemas.StatusInvalidRequest, wantScope: schemas.ScopeGroup, wantMessage: "content_policy_violation"},
		{name: "400 content_filter input refusal ends the group", status: 400, body: "error_400_content_filter.json",
			wantStatus: schemas.StatusInvalidRequest, wantScope: schemas.ScopeGroup, wantMessage: "content_filter"},
		{name: "413 request too large ends the group", status: 413,
			wantStatus: schemas.StatusInvalidRequest, wantScope: schemas.ScopeGroup, wantMessage: "HTTP 413"},
		{name: "422 unprocessable request ends the group", status: 422,
			wantStatus: schemas.StatusInvalidRequest, wantScope: schemas.ScopeGroup, wantMessage: "HTTP 422"},
		{name: "401 is route-local auth", status: 401, body: "error_401_invalid_api_key.json",
			wantStatus: schemas.StatusAuth, wantScope: schemas.ScopeRoute, wantMessage: "invalid_api_key"},
		{name: "403 is route-local auth", status: 403, body: "error_403_region.json",
			wantStatus: schemas.StatusAuth, wantScope: schemas.ScopeRoute, wantMessage: "unsupported_country_region_territory"},
		{name: "404 model_not_found is route-local not_found", status: 404, body: "error_404_model_not_found.json",
			wantStatus: schemas.StatusNotFound, wantScope: schemas.ScopeRoute, wantMessage: "model_not_found"},
		{name: "model_not_found under 400 is still route-local", status: 400, body: "error_404_model_not_found.json",
			wantStatus: schemas.StatusNotFound, wantScope: schemas.ScopeRoute, wantMessage: "model_not_found"},
		{name: "other 4xx is route-local", status: 418,
			wantStatus: schemas.StatusInvalidRequest, wantScope: schemas.ScopeRoute, wantMessage: "HTTP 418"},
		{name: "408 is a transient timeout", status: 408,
			wantStatus: schemas.StatusTimeout, wantScope: schemas.ScopeTransient, wantMessage: "HTTP 408"},
		{name: "409 is a transient server error", status: 409,
			wantStatus: schemas.StatusServerError, wantScope: schemas.ScopeTransient, wantMessage: "HTTP 409"},
		{name: "500 is a transient server error", status: 500, body: "error_500_server_error.json",
			wantStatus: schemas.StatusServerError, wantScope: schemas.ScopeTransient, wantMessage: "HTTP 500 server_error: the provider failed; provider message withheld (72 bytes)"},
		{name: "502 without a body is a transient server error", status: 502,
			wantStatus: schemas.StatusServerError, wantScope: schemas.ScopeTransient, wantMessage: "HTTP 502"},
		{name: "503 without Retry-After is a transient server error", status: 503, body: "error_503_overloaded.json",
			wantStatus: schemas.StatusServerError, wantScope: schemas.ScopeTransient, wantMessage: "HTTP 503"},
		{name: "503 with Retry-After is overload pushback", status: 503, body: "error_503_overloaded.json",
			header:     map[string]string{"Retry-After": "7"},
			wantStatus: schemas.StatusOverloaded, wantScope: schemas.ScopePushback, wantRetryAfter: 7 * time.Second, wantMessage: "overloaded"},
		{name: "504 is a transient timeout", status: 504,
			wantStatus: schemas.StatusTimeout, wantScope: schemas.ScopeTransient, wantMessage: "HTTP 504"},
		{name: "429 is pushback with Retry-After in seconds", status: 429, body: "error_429_rate_limit.json",
			header:     map[string]string{"Retry-After": "20"},
			wantStatus: schemas.StatusRateLimited, wantScope: schemas.ScopePushback, wantRetryAfter: 20 * time.Second, wantMessage: "rate_limit_exceeded"},
		{name: "429 is pushback with Retry-After as an HTTP date", status: 429, body: "error_429_rate_limit.json",
			header:     map[string]string{"Retry-After": fixedNow.Add(90 * time.Second).Format(http.TimeFormat)},
			wantStatus: schemas.StatusRateLimited, wantScope: schemas.ScopePushback, wantRetryAfter: 90 * time.Second, wantMessage: "rate_limit_exceeded"},
		{name: "429 retry-after-ms is preferred to Retry-After", status: 429, body: "error_429_rate_limit.json",
			header:     map[string]string{"Retry-After": "1", "retry-after-ms": "120"},
			wantStatus: schemas.StatusRateLimited, wantScope: schemas.ScopePushback, wantRetryAfter: 120 * time.Millisecond, wantMessage: "rate_limit_exceeded"},
		{name: "429 without Retry-After is pushback of unknown length", status: 429, body: "error_429_rate_limit.json",
			wantStatus: schemas.StatusRateLimited, wantScope: schemas.ScopePushback, wantMessage: "rate_limit_exceeded"},
		{name: "429 insufficient_quota quarantines the route instead of pausing it", status: 429, body: "error_429_insufficient_quota.json",
			header:     map[string]string{"Retry-After": "20"},
			wantStatus: schemas.StatusRateLimited, wantScope: schemas.ScopeRoute, wantMessage: "insufficient_quota"},
		{name: "529 is overload pushback", status: 529, body: "error_529_overloaded.json",
			header:     map[string]string{"Retry-After": "3"},
			wantStatus: schemas.StatusOverloaded, wantScope: schemas.ScopePushback, wantRetryAfter: 3 * time.Second, wantMessage: "overloaded_error"},
		{name: "a redirect is not followed and is route-local", status: 307,
			header:     map[string]string{"Location": "/v1/chat/completions"},
			wantStatus: schemas.StatusNotFound, wantScope: schemas.ScopeRoute, wantMessage: "HTTP 307"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := answer{status: tc.status, header: tc.header}
			if tc.body != "" {
				a.body = fixture(t, tc.body)
			}
			p := newProvider(t, replay(a))
			var rec recorder

			out, err := newAdapter(t, p, testKey).Stream(context.Background(), hello(), &rec)
			ue := asError(t, err)
			if ue.Status != tc.wantStatus || ue.Scope != tc.wantScope {
				t.Errorf("classified as %s (%s), want %s (%s)", ue.Status, ue.Scope, tc.wantStatus, tc.wantScope)
			}
			if ue.HTTPStatus != tc.status {
				t.Errorf("HTTPStatus = %d, want %d", ue.HTTPStatus, tc.status)
			}
			if ue.RetryAfter != tc.wantRetryAfter {
				t.Errorf("RetryAfter = %v, want %v", ue.RetryAfter, tc.wantRetryAfter)
			}
			if !strings.Contains(ue.Message, tc.wantMessage) {
				t.Errorf("message %q does not mention %q", ue.Message, tc.wantMessage)
			}
			if strings.Contains(ue.Error(), testKey) {
				t.Errorf("error text %q contains the API key", ue.Error())
			}
			if rec.firstBytes != 0 || len(rec.deltas) != 0 {
				t.Errorf("sink saw %d first bytes and %d deltas for an error answer, want none", rec.firstBytes, len(rec.deltas))
			}
			if !reflect.DeepEqual(out, Outcome{}) {
				t.Errorf("outcome = %+v, want zero: a rejected request is not billed", out)
			}
			if n := p.requests.Load(); n != 1 {
				t.Errorf("provider saw %d requests, want exactly 1 (no retry, no redirect)", n)
			}
		})
	}
}

func TestRetryAfterIsReadFromMillisecondsSecondsOrDate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		header map[string]string
		want   time.Duration
	}{
		{"absent is zero", nil, 0},
		{"integer seconds", map[string]string{"Retry-After": "20"}, 20 * time.Second},
		{"fractional seconds", map[string]string{"Retry-After": "1.5"}, 1500 * time.Millisecond},
		{"HTTP date measured from the injected clock", map[string]string{"Retry-After": fixedNow.Add(time.Minute).Format(http.TimeFormat)}, time.Minute},
		{"HTTP date in the past is zero", map[string]string{"Retry-After": fixedNow.Add(-time.Minute).Format(http.TimeFormat)}, 0},
		{"negative seconds are zero", map[string]string{"Retry-After": "-5"}, 0},
		{"garbage is zero", map[string]string{"Retry-After": "soon"}, 0},
		{"retry-after-ms wins", map[string]string{"Retry-After-Ms": "250", "Retry-After": "9"}, 250 * time.Millisecond},
		{"unparsable retry-after-ms falls back to Retry-After", map[string]string{"Retry-After-Ms": "x", "Retry-After": "9"}, 9 * time.Second},
		{"absurd values are clamped", map[string]string{"Retry-After": "1e30"}, MaxRetryAfter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.header {
				h.Set(k, v)
			}
			if got := retryAfter(h, fixedNow); got != tc.want {
				t.Errorf("retryAfter = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestErrorsInsideAStreamAreClassifiedByTypeAndCode(t *testing.T) {
	for _, tc := range []struct {
		name       string
		err        apiError
		wantStatus schemas.StatusClass
		wantScope  schemas.ErrorScope
	}{
		{"invalid_request_error ends the group", apiError{Type: "invalid_request_error"}, schemas.StatusInvalidRequest, schemas.ScopeGroup},
		{"context_length_exceeded ends the group", apiError{Code: "context_length_exceeded"}, schemas.StatusInvalidRequest, schemas.ScopeGroup},
		{"content_filter ends the group", apiError{Code: "content_filter"}, schemas.StatusInvalidRequest, schemas.ScopeGroup},
		{"model_not_found is route-local", apiError{Type: "invalid_request_error", Code: "model_not_found"}, schemas.StatusNotFound, schemas.ScopeRoute},
		{"authentication_error is route-local auth", apiError{Type: "authentication_error"}, schemas.StatusAuth, schemas.ScopeRoute},
		{"insufficient_quota is route-local", apiError{Type: "insufficient_quota"}, schemas.StatusRateLimited, schemas.ScopeRoute},
		{"rate_limit_exceeded is pushback", apiError{Type: "requests", Code: "rate_limit_exceeded"}, schemas.StatusRateLimited, schemas.ScopePushback},
		{"overloaded_error is pushback", apiError{Type: "overloaded_error"}, schemas.StatusOverloaded, schemas.ScopePushback},
		{"server_error is transient", apiError{Type: "server_error"}, schemas.StatusServerError, schemas.ScopeTransient},
		{"an unknown type is transient", apiError{Type: "mystery"}, schemas.StatusServerError, schemas.ScopeTransient},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, scope, _ := classifyStatus(0, tc.err, nil, fixedNow)
			if status != tc.wantStatus || scope != tc.wantScope {
				t.Errorf("classified as %s (%s), want %s (%s)", status, scope, tc.wantStatus, tc.wantScope)
			}
		})
	}
}

func TestProviderErrorBodiesOfCompatibleServersAreRead(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		want apiError
		ok   bool
	}{
		{"OpenAI error object", `{"error":{"message":"m","type":"t","param":null,"code":"c"}}`, apiError{Message: "m", Type: "t", Code: "c"}, true},
		{"numeric code", `{"error":{"message":"m","type":"t","code":400}}`, apiError{Message: "m", Type: "t", Code: "400"}, true},
		{"null code", `{"error":{"message":"m","type":"t","code":null}}`, apiError{Message: "m", Type: "t"}, true},
		{"error as a string", `{"error":"model overloaded"}`, apiError{Message: "model overloaded"}, true},
		{"fields at the top level", `{"object":"error","message":"m","type":"BadRequestError","code":400}`, apiError{Message: "m", Type: "BadRequestError", Code: "400"}, true},
		{"Anthropic error envelope", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}`,
			apiError{Message: "Overloaded", Type: "overloaded_error"}, true},
		{"an Anthropic message is no error", `{"id":"msg_1","type":"message","role":"assistant","content":[]}`, apiError{}, false},
		{"not JSON", `<html>Bad Gateway</html>`, apiError{}, false},
		{"JSON without an error", `{"id":"chatcmpl-1"}`, apiError{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parseAPIError([]byte(tc.body))
			if got != tc.want || ok != tc.ok {
				t.Errorf("parseAPIError = %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// A provider's error answer keeps, in Error.Message, only its status, the
// type and code it names from the published vocabulary, the top-level
// member its param names and our own description: never its free text, and
// nothing from a field outside the vocabulary — whatever the provider put
// there (an echoed key, the prompt) is dropped whole (docs/architecture.md §9).
func TestProviderErrorMessagesKeepOnlyKnownNamesAndOurOwnWords(t *testing.T) {
	const secret = "zqechoedsecret" // letters only: no pattern would redact it
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   string
	}{
		{name: "known type, code and param are kept; the message is withheld", status: 400,
			body: `{"error":{"message":"you said ` + secret + `","type":"invalid_request_error","code":"context_length_exceeded","param":"messages[3].content"}}`,
			want: "HTTP 400 invalid_request_error context_length_exceeded (param messages): the provider refused the request as invalid; provider message withheld (23 bytes)"},
		{name: "a secret in code, type and param is dropped whole", status: 401,
			body: `{"error":{"message":"","type":"` + secret + `","code":"` + secret + `","param":"` + secret + `"}}`,
			want: "HTTP 401: the provider refused the route's credentials or access; unrecognized error fields withheld"},
		{name: "a secret after a known param root is dropped with the path", status: 400,
			body: `{"error":{"type":"invalid_request_error","param":"messages.` + secret + `"}}`,
			want: "HTTP 400 invalid_request_error (param messages): the provider refused the request as invalid"},
		{name: "a numeric code that is a status is kept", status: 500,
			body: `{"error":{"message":"x","code":500}}`,
			want: "HTTP 500 500: the provider failed; provider message withheld (1 bytes)"},
		{name: "a long numeric code is dropped", status: 500,
			body: `{"error":{"code":1234567890123}}`,
			want: "HTTP 500: the provider failed; unrecognized error fields withheld"},
		{name: "a top-level error string is withheld", status: 503,
			body: `{"error":"` + secret + ` is overloaded"}`,
			want: "HTTP 503: the provider failed; provider message withheld (28 bytes)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProvider(t, replay(answer{status: tc.status, body: []byte(tc.body)}))
			_, err := newAdapter(t, p, testKey).Stream(context.Background(), hello(), nil)
			ue := asError(t, err)
			if ue.Message != tc.want {
				t.Errorf("message %q, want %q", ue.Message, tc.want)
			}
			if strings.Contains(ue.Error(), secret) {
				t.Errorf("error text %q keeps the provider's text", ue.Error())
			}
		})
	}
}
