package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// refusingGateway answers every request 401 invalid_api_key, as a gateway
// with tenants does without a key, and counts the requests.
func refusingGateway(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, `{"error":{"message":"missing or unknown API key","type":"authentication_error","code":"invalid_api_key"}}`)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// bench without $HEDGEROW_API_KEY stops at the gateway's first 401 and
// names the variable, instead of running its whole duration of 401s; with
// a key the gateway refuses, it says the key was refused.
func TestBenchStopsAtTheFirst401NamingTheKeyVariable(t *testing.T) {
	srv, n := refusingGateway(t)
	for _, tc := range []struct{ key, want string }{
		{"", "$HEDGEROW_API_KEY is not set"},
		{"wrong-key", "refused the API key in $HEDGEROW_API_KEY"},
	} {
		t.Setenv(apiKeyEnv, tc.key)
		n.Store(0)
		start := time.Now()
		out, err := runRoot(t, "bench", "--url", srv.URL, "--rate", "50", "--duration", "30s", "--warmup", "5s", "--quiet")
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "invalid_api_key") {
			t.Errorf("bench with key %q: %v\n%s\nwant an error saying %q", tc.key, err, out, tc.want)
		}
		if took := time.Since(start); took > 10*time.Second || n.Load() > 100 {
			t.Errorf("bench with key %q ran %v and sent %d requests after the first 401", tc.key, took, n.Load())
		}
	}
}

// report without a key says which variable to set, not only the server's 401.
func TestReportWithoutAKeySaysWhichVariableToSet(t *testing.T) {
	srv, _ := refusingGateway(t)
	for _, tc := range []struct {
		env  string
		args []string
		want string
	}{
		{"", nil, "$HEDGEROW_API_KEY is not set"},
		{"wrong-key", nil, "refused the API key in $HEDGEROW_API_KEY"},
		{"", []string{"--api-key", "wrong-key"}, "refused the key --api-key gave"},
	} {
		t.Setenv(apiKeyEnv, tc.env)
		out, err := runRoot(t, append([]string{"report", "--url", srv.URL}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "401") {
			t.Errorf("report (env %q, %v): %v\n%s\nwant an error saying %q", tc.env, tc.args, err, out, tc.want)
		}
	}
}
