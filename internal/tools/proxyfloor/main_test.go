package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestTheProxyForwardsRequestsToTheRouteUnchanged(t *testing.T) {
	route := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, r.Method+" "+r.URL.Path+" "+string(body))
	}))
	defer route.Close()
	proxy, err := newProxy(route.URL)
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(proxy)
	defer front.Close()

	resp, err := http.Post(front.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"max_tokens":20}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	if want := `POST /v1/chat/completions {"max_tokens":20}`; resp.StatusCode != http.StatusOK || string(got) != want {
		t.Fatalf("got %d %q, want 200 %q", resp.StatusCode, got, want)
	}
}

func TestARouteThatIsNotABaseURLIsRefused(t *testing.T) {
	for _, to := range []string{"", "127.0.0.1:9301", "::bad"} {
		if _, err := newProxy(to); err == nil || !strings.Contains(err.Error(), "want a base URL") {
			t.Errorf("newProxy(%q) = %v, want a base URL error", to, err)
		}
	}
}
