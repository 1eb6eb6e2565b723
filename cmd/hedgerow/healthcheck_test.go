package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestHealthcheckExitsZeroOn2xxAndFailsNamingTheStatus: the command a
// scratch image's probe runs passes on a ready gateway and fails, with
// the status in its one line, on an unready one.
func TestHealthcheckExitsZeroOn2xxAndFailsNamingTheStatus(t *testing.T) {
	var unready atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if unready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	if out, err := runRoot(t, "healthcheck", "--timeout", "2s", srv.URL+"/readyz"); err != nil {
		t.Fatalf("healthcheck of a ready URL: %v\n%s", err, out)
	}
	unready.Store(true)
	out, err := runRoot(t, "healthcheck", srv.URL+"/readyz")
	if err == nil || !strings.Contains(err.Error(), "503") || exitCode(err) == 0 {
		t.Fatalf("healthcheck of an unready URL: %v (exit %d)\n%s", err, exitCode(err), out)
	}
	if _, err := runRoot(t, "healthcheck"); err == nil {
		t.Fatal("healthcheck without a URL succeeded")
	}
}
