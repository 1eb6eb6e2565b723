package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// wait bounds every wait for what the provider or the adapter does as soon
// as the test acts. It only turns a hang into a failure; the tests never
// wait for time to pass.
const wait = 10 * time.Second

// testKey is the key the recorded 401 answer echoes.
const testKey = "sk-hedgerow-test-0123456789abcdef"

// fixedNow is the injected clock: Retry-After dates are measured from it.
var fixedNow = time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC)

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatalf("fixture: %v", err)
	}
	return b
}

// answer is one recorded provider response.
type answer struct {
	status      int
	contentType string // default: text/event-stream for 2xx, application/json otherwise
	header      map[string]string
	body        []byte
}

// provider is a test server that replays answers on the Chat Completions
// path and counts the requests it received.
type provider struct {
	*httptest.Server
	requests atomic.Int32
}

// newProvider starts a server whose handler serves POST /v1/chat/completions
// and answers 404 elsewhere, so a wrong base_url convention fails loudly.
func newProvider(t *testing.T, h http.HandlerFunc) *provider {
	t.Helper()
	p := &provider{}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.requests.Add(1)
		if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		h(w, r)
	}))
	t.Cleanup(p.Close)
	return p
}

func replay(a answer) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ct := a.contentType
		if ct == "" {
			ct = "application/json"
			if a.status/100 == 2 || a.status == 0 {
				ct = "text/event-stream"
			}
		}
		w.Header().Set("Content-Type", ct)
		for k, v := range a.header {
			w.Header().Set(k, v)
		}
		status := a.status
		if status == 0 {
			status = http.StatusOK
		}
		w.WriteHeader(status)
		_, _ = w.Write(a.body)
	}
}

// newAdapter returns an OpenAI adapter for p with the route model
// "route-model-2024" and the given key.
func newAdapter(t *testing.T, p *provider, key string) *OpenAI {
	t.Helper()
	o, err := NewOpenAI(Options{BaseURL: p.URL + "/v1", Model: "route-model-2024", APIKey: key, Now: func() time.Time { return fixedNow }})
	if err != nil {
		t.Fatalf("NewOpenAI: %v", err)
	}
	t.Cleanup(o.CloseIdleConnections)
	return o
}

func hello() *schemas.ChatRequest {
	return &schemas.ChatRequest{
		Model:    "general",
		Messages: []schemas.Message{{Role: schemas.MessageUser, Content: schemas.TextContent("Say hello.")}},
	}
}

// recorder is a Sink that keeps what it was told. Stream calls it on the
// caller's goroutine, so it needs no lock.
type recorder struct {
	firstBytes int
	deltas     []Delta
	onDelta    func(Delta)
}

func (r *recorder) FirstByte() { r.firstBytes++ }

func (r *recorder) Delta(d Delta) {
	r.deltas = append(r.deltas, d)
	if r.onDelta != nil {
		r.onDelta(d)
	}
}

func asError(t *testing.T, err error) *Error {
	t.Helper()
	var ue *Error
	if !errors.As(err, &ue) {
		t.Fatalf("error %v (%T) is not an *upstream.Error", err, err)
	}
	return ue
}

// sameJSON reports whether two JSON texts encode the same value.
func sameJSON(t *testing.T, got, want []byte) bool {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("got invalid JSON %s: %v", got, err)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatalf("want invalid JSON %s: %v", want, err)
	}
	return reflect.DeepEqual(g, w)
}

// expiringContext is a context whose deadline the test passes by hand, so
// a deadline in the middle of a stream needs no wall clock.
type expiringContext struct {
	context.Context
	done chan struct{}
}

func newExpiringContext() *expiringContext {
	return &expiringContext{Context: context.Background(), done: make(chan struct{})}
}

func (c *expiringContext) Done() <-chan struct{} { return c.done }

func (c *expiringContext) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

func (c *expiringContext) expire() { close(c.done) }
