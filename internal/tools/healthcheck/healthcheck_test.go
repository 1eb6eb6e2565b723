package healthcheck

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestACheckPassesOnlyOn2xxAndSaysWhyInOneLineOtherwise: a 2xx passes; a
// refused connection, a server that does not answer in time, a non-2xx
// status (a redirect included, never followed) and a URL that is not HTTP
// each fail with one line naming the cause, and a password in the URL is
// never printed.
func TestACheckPassesOnlyOn2xxAndSaysWhyInOneLineOtherwise(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("/unready", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"ready":false}`, http.StatusServiceUnavailable)
	})
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ok", http.StatusFound) })
	mux.HandleFunc("/hang", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	closed := httptest.NewServer(mux)
	closedURL := closed.URL
	closed.Close()

	for _, tc := range []struct {
		name, url string
		timeout   time.Duration
		want      string // "" passes
	}{
		{"2xx passes", srv.URL + "/ok", 0, ""},
		{"a 503 fails naming the status", srv.URL + "/unready", 0, "answered 503 Service Unavailable"},
		{"a redirect is not followed", srv.URL + "/moved", 0, "answered 302 Found"},
		{"a refused connection says so", closedURL + "/readyz", 0, "connection refused"},
		{"no answer in time names the timeout", srv.URL + "/hang", 100 * time.Millisecond, "no answer within 100ms"},
		{"not an HTTP URL", "127.0.0.1:8080/readyz", 0, "is not an http:// or https:// URL"},
		{"a password is masked", strings.Replace(closedURL, "://", "://u:sekrit@", 1), 0, "xxxxx@"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(context.Background(), tc.url, tc.timeout)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Check(%s): %v, want nil", tc.url, err)
			case tc.want == "":
				return
			case err == nil:
				t.Fatalf("Check(%s) passed, want %q", tc.url, tc.want)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) || strings.Contains(msg, "\n") || strings.Contains(msg, "sekrit") {
				t.Errorf("Check(%s) = %q, want one line containing %q and no password", tc.url, msg, tc.want)
			}
		})
	}
}
