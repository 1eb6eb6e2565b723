package node

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/hedgerow/hedgerow/simulator/fakellm"
)

// fakeReadHeaderTimeout bounds reading a request's headers; bodies are
// bounded by the fake's own size limit, and answers may take as long as the
// workload draws (a hang lasts until the hang cap).
const fakeReadHeaderTimeout = 10 * time.Second

// FakeLLM is a running `hedgerow fakellm`: one simulator route served over
// HTTP.
type FakeLLM struct {
	fake *fakellm.Server
	http *httpServer
}

// FakeLLMOptions are what a fakellm process adds around the simulator's
// route.
type FakeLLMOptions struct {
	// Timings, when positive, keeps the last Timings requests' moments to
	// the microsecond (arrival, first byte written, client gone, end) and
	// serves them at GET /timings (FakeTimings), for measuring a cancel
	// path the fake's millisecond records cannot resolve.
	Timings int
}

// StartFakeLLM serves the simulator route cfg describes on listen.
func StartFakeLLM(listen string, cfg fakellm.Options, log *slog.Logger) (*FakeLLM, error) {
	return StartFakeLLMWith(listen, cfg, FakeLLMOptions{}, log)
}

// StartFakeLLMWith is StartFakeLLM with the process's additions o.
func StartFakeLLMWith(listen string, cfg fakellm.Options, o FakeLLMOptions, log *slog.Logger) (*FakeLLM, error) {
	if o.Timings < 0 {
		return nil, fmt.Errorf("fakellm: timings %d is negative", o.Timings)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	fake, err := fakellm.New(cfg)
	if err != nil {
		return nil, err // it names the fake LLM and the bad setting
	}
	var handler http.Handler = fake
	if o.Timings > 0 {
		handler = newFakeTimings(fake, o.Timings)
	}
	h, err := serveHTTP(listen, &http.Server{Handler: handler, ReadHeaderTimeout: fakeReadHeaderTimeout}, log)
	if err != nil {
		fake.Close()
		return nil, fmt.Errorf("fakellm: %w", err)
	}
	return &FakeLLM{fake: fake, http: h}, nil
}

// Addr is the address the server listens on.
func (f *FakeLLM) Addr() net.Addr { return f.http.Addr() }

// Failed delivers an error if the HTTP server stops on its own.
func (f *FakeLLM) Failed() <-chan error { return f.http.failed }

// Stop ends the requests the fake holds first — a hung attempt would
// otherwise hold Shutdown until its hang cap — then shuts the HTTP server
// down within ctx.
func (f *FakeLLM) Stop(ctx context.Context) error {
	f.fake.Close()
	return f.http.shutdown(ctx)
}
