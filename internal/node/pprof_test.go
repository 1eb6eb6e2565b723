package node

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/natstest"
)

// TestPprofIsServedOnTheInternalListenerOnlyAndOnlyWhenOn: with
// http.pprof the profiler answers on the internal listener and the API
// listener answers 404 unknown_url; with it off both answer 404.
func TestPprofIsServedOnTheInternalListenerOnlyAndOnlyWhenOn(t *testing.T) {
	type want struct {
		status   int
		contains string
	}
	notFound := want{404, "unknown_url"}
	tests := []struct {
		name     string
		pprof    bool
		internal map[string]want // path → what the internal listener answers
		api      map[string]want
	}{
		{
			name:  "on",
			pprof: true,
			internal: map[string]want{
				"/debug/pprof/":                  {200, "goroutine"},
				"/debug/pprof/cmdline":           {200, ""},
				"/debug/pprof/goroutine?debug=1": {200, "goroutine profile"},
				"/debug/pprof/profile?seconds=1": {200, ""},
				"/metrics":                       {200, "go_goroutines"},
				"/debug/pprof/no-such-profile":   {404, "Unknown profile"},
				"/debug/pprofx":                  notFound,
				"/v1/models":                     notFound,
			},
			api: map[string]want{"/debug/pprof/": notFound, "/debug/pprof/profile?seconds=1": notFound, "/v1/models": {200, `"general"`}},
		},
		{
			name:     "off",
			internal: map[string]want{"/debug/pprof/": notFound, "/debug/pprof/profile?seconds=1": notFound, "/metrics": {200, "go_goroutines"}},
			api:      map[string]want{"/debug/pprof/": notFound, "/debug/pprof/profile?seconds=1": notFound},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := parse(t, "http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1", "")
			cfg.HTTP.InternalListen, cfg.HTTP.Pprof = "127.0.0.1:0", tt.pprof
			nc := natstest.Connect(t, natstest.Start(t, natstest.MaxPayload(16<<20)), nats.Name("gateway"))
			g, err := StartGateway(cfg, nc, nil, Options{})
			if err != nil {
				t.Fatalf("StartGateway: %v", err)
			}
			defer stop(t, g)
			for listener, paths := range map[string]map[string]want{
				"internal " + g.InternalAddr().String(): tt.internal,
				"api " + g.Addr().String():              tt.api,
			} {
				addr := strings.Fields(listener)[1]
				for path, w := range paths {
					status, body := get(t, "http://"+addr+path)
					if status != w.status || !strings.Contains(string(body), w.contains) {
						t.Errorf("%s: GET %s = %d %.200q, want %d with %q", listener, path, status, body, w.status, w.contains)
					}
				}
			}
		})
	}
}

// TestWithPprofTheInternalListenerLetsAProfileOutlastItsReadTimeout: the
// internal listener's write timeout is http.read_timeout, which would
// refuse pprof's default 30 s profile; with pprof it is long enough for
// one, and no write timeout stays none.
func TestWithPprofTheInternalListenerLetsAProfileOutlastItsReadTimeout(t *testing.T) {
	tests := []struct {
		name string
		http config.HTTP
		want time.Duration
	}{
		{"without pprof, the read timeout", config.HTTP{ReadTimeout: 10 * time.Second}, 10 * time.Second},
		{"with pprof, long enough for a profile", config.HTTP{ReadTimeout: 10 * time.Second, Pprof: true}, pprofWriteTimeout},
		{"with pprof, a longer read timeout stays", config.HTTP{ReadTimeout: 5 * time.Minute, Pprof: true}, 5 * time.Minute},
		{"with pprof, none stays none", config.HTTP{Pprof: true}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := internalWriteTimeout(tt.http); got != tt.want {
				t.Fatalf("internalWriteTimeout = %v, want %v", got, tt.want)
			}
			if tt.http.Pprof && tt.want != 0 && tt.want <= 30*time.Second {
				t.Fatalf("a write timeout of %v refuses pprof's default 30 s profile", tt.want)
			}
		})
	}
}
