// Package loadgen is an open-loop load generator for hedgerow's
// OpenAI-compatible HTTP front door (and any server that speaks it).
//
// Requests are sent at seeded Poisson arrival times whether or not earlier
// ones have been answered — a closed loop would slow down exactly when the
// server does and hide its tail (coordinated omission). Concurrency is bounded
// only by a generous cap; a send the cap holds back is flagged, and every
// latency is measured from when the request was due, not from when it went
// out, so a held-back send still counts its wait.
//
// Each response is read to its end: a stream is parsed as server-sent events
// for the time to its first content token and its total time; the
// X-Hedgerow-* values are read from the headers or, when the server declared
// them as trailers, from the trailers after the last event.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of the optional Options fields.
const (
	DefaultPath        = "/v1/chat/completions"
	DefaultMaxInFlight = 1024
)

// ErrInvalidOptions is wrapped by every error about the Options themselves.
var ErrInvalidOptions = errors.New("loadgen: invalid options")

// Request is one request of a run: a JSON body and the headers that go with
// it (e.g. X-Hedgerow-Operation, Idempotency-Key). Target indexes
// Options.Targets; it is 0 when the run has one target.
type Request struct {
	Body   []byte
	Header http.Header
	Target int
}

// Target is where requests go: it sends one and reads its answer to the
// end, filling in the result's Status, Err, FirstToken, Chunks and Hedge
// (Run stamps the times). since returns the time elapsed since the request
// was due. ctx carries the request's deadline (Options.Timeout).
type Target interface {
	Send(ctx context.Context, rq Request, since func() time.Duration, res *Result)
}

// Options describes one run.
type Options struct {
	// BaseURL is the server's root, e.g. "http://127.0.0.1:8080"; Path is
	// appended to it (empty: DefaultPath). Used when Targets is empty.
	BaseURL string
	Path    string
	// APIKey is sent as a bearer token when set.
	APIKey string
	// Targets, when set, replace BaseURL: request i goes to
	// Targets[Requests[i].Target] (see NewHTTPTarget, NewNATSTarget).
	Targets []Target
	// Requests are sent in order, one per arrival.
	Requests []Request
	// Rate is the mean of the Poisson arrivals, per second; Seed makes the
	// gaps between them reproducible (see PoissonGaps).
	Rate float64
	Seed uint64
	// Timeout is each request's client deadline, from when it is sent to the
	// end of its response. Required: it is what bounds a run in time.
	Timeout time.Duration
	// MaxInFlight caps requests in flight (0: DefaultMaxInFlight); it is a
	// safety bound, not a pacing mechanism.
	MaxInFlight int
	// Client sends the requests; nil means NewClient(MaxInFlight).
	Client *http.Client
	// Progress, when set, is told of every finished request, from the
	// request's goroutine; it must not block.
	Progress func(Result)
	// Stop, when set, is told of every finished request, from the request's
	// goroutine; the first non-nil error it returns stops the run: no further
	// request is sent, those in flight are cancelled, and Run returns the
	// summary so far with that error (errors.Is finds it). A run that cannot
	// succeed — e.g. every request refused for want of an API key — ends at
	// once instead of after its whole duration.
	Stop func(Result) error
	// OnCapWait, when set, is called when a due request has to wait for the
	// in-flight cap, before it waits.
	OnCapWait func(index int)
	// Now is the clock; nil means time.Now. Waits use real timers.
	Now func() time.Time
}

// Result is what one request measured. Durations are from when the request
// was due (its arrival time), so a send held back by the cap counts its wait.
type Result struct {
	Index int
	// Target is the request's Target.
	Target int
	// Due and Sent are offsets from the start of the run.
	Due  time.Duration
	Sent time.Duration
	// CapDelayed is set when the in-flight cap held the send back.
	CapDelayed bool
	// Status is the HTTP status (for a NATS target, 200 or the status of its
	// error answer); 0 when no response arrived.
	Status int
	// Err is why the request did not end in a complete answer: a transport
	// error, a *StatusError, an error event in the stream, a *client.Error,
	// or ErrIncomplete.
	Err error
	// FirstToken is the time to the first content or tool-call token; zero
	// when none arrived. Total is the time to the end of the response.
	FirstToken time.Duration
	Total      time.Duration
	// Chunks counts the stream's events that carried content or tool calls.
	Chunks int
	Hedge  Hedge
}

// Hedge holds the X-Hedgerow-* values of a response: how the answer was won.
type Hedge struct {
	Attempts    int
	Hedged      bool
	WinnerRoute string
	Gate        string
	// FromTrailers is set when the values came as HTTP trailers.
	FromTrailers bool
}

// Summary is the outcome of a run.
type Summary struct {
	// Start is when the run began; every Result's offsets count from it.
	Start time.Time
	// Results are indexed like Options.Requests; a request never sent (the
	// run was cancelled first) has Status 0 and Err set.
	Results []Result
	// Sent counts the requests sent, CapDelayed those the cap held back.
	Sent, CapDelayed int
	// Elapsed is from Start until the last response ended.
	Elapsed time.Duration
}

// PoissonGaps returns the n gaps between arrivals of a Poisson process of
// the given rate (per second), the first measured from the start: a pure
// function of the seed, so two runs with one seed send at the same offsets.
func PoissonGaps(n int, rate float64, seed uint64) ([]time.Duration, error) {
	if !(rate > 0) || math.IsInf(rate, 0) {
		return nil, fmt.Errorf("%w: rate %v per second must be finite and > 0", ErrInvalidOptions, rate)
	}
	if n < 0 {
		return nil, fmt.Errorf("%w: %d gaps", ErrInvalidOptions, n)
	}
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	gaps := make([]time.Duration, n)
	for i := range gaps {
		gaps[i] = time.Duration(r.ExpFloat64() / rate * float64(time.Second))
	}
	return gaps, nil
}

// NewClient returns an HTTP client whose transport keeps up to maxInFlight
// connections per host alive, so an open-loop run does not dial (and measure
// a TCP handshake) for most requests. It sets no timeout of its own: each
// request carries Options.Timeout.
func NewClient(maxInFlight int) *http.Client {
	if maxInFlight <= 0 {
		maxInFlight = DefaultMaxInFlight
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = maxInFlight
	t.MaxIdleConnsPerHost = maxInFlight
	t.DisableCompression = true // a stream must not wait on a gzip buffer
	return &http.Client{Transport: t}
}

// Run sends cfg.Requests at their Poisson arrival times and returns what each
// measured once every response has ended. Cancelling ctx stops sending and
// cancels the requests in flight; Run then returns the summary so far with
// ctx's error.
func Run(ctx context.Context, cfg Options) (*Summary, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	gaps, err := PoissonGaps(len(cfg.Requests), cfg.Rate, cfg.Seed)
	if err != nil {
		return nil, err
	}
	g := &generator{cfg: cfg, now: cfg.Now, targets: cfg.Targets}
	if g.now == nil {
		g.now = time.Now
	}
	if len(g.targets) == 0 {
		client := cfg.Client
		if client == nil {
			// A client of its own leaves no idle connections behind.
			client = NewClient(cfg.MaxInFlight)
			defer client.CloseIdleConnections()
		}
		t, err := NewHTTPTarget(cfg.BaseURL, cfg.Path, cfg.APIKey, client)
		if err != nil {
			return nil, err
		}
		g.targets = []Target{t}
	}
	for i, rq := range cfg.Requests {
		if rq.Target < 0 || rq.Target >= len(g.targets) {
			return nil, fmt.Errorf("%w: request %d names target %d of %d", ErrInvalidOptions, i, rq.Target, len(g.targets))
		}
	}
	return g.run(ctx, gaps)
}

func (c Options) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidOptions, fmt.Sprintf(format, args...))
	}
	if c.Timeout <= 0 {
		return bad("timeout %v: every request needs a client deadline", c.Timeout)
	}
	if c.MaxInFlight < 0 {
		return bad("max in flight %d is negative", c.MaxInFlight)
	}
	return nil
}

// httpTarget is an OpenAI-compatible chat completions endpoint.
type httpTarget struct {
	url    string
	apiKey string
	client *http.Client
}

// NewHTTPTarget returns the chat completions endpoint at baseURL + path
// (empty: DefaultPath) as a Target, sending apiKey as a bearer token when
// set, over client (nil: NewClient(DefaultMaxInFlight)).
func NewHTTPTarget(baseURL, path, apiKey string, client *http.Client) (Target, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: base URL %q: want an absolute http:// or https:// URL", ErrInvalidOptions, baseURL)
	}
	if path == "" {
		path = DefaultPath
	}
	if client == nil {
		client = NewClient(DefaultMaxInFlight)
	}
	return &httpTarget{url: strings.TrimSuffix(baseURL, "/") + "/" + strings.TrimPrefix(path, "/"), apiKey: apiKey, client: client}, nil
}

// generator is one run in progress.
type generator struct {
	cfg     Options
	targets []Target
	now     func() time.Time
	start   time.Time
}

func (g *generator) run(ctx context.Context, gaps []time.Duration) (*Summary, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	limit := g.cfg.MaxInFlight
	if limit == 0 {
		limit = DefaultMaxInFlight
	}
	g.start = g.now()
	sum := &Summary{Start: g.start, Results: make([]Result, len(g.cfg.Requests))}
	slots := make(chan struct{}, limit)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var (
		wg     sync.WaitGroup
		due    time.Duration
		runErr error
		// stopped is the first error Stop returned.
		stopped atomic.Pointer[error]
	)
	sent := 0
schedule:
	for i := range g.cfg.Requests {
		due += gaps[i]
		if wait := due - g.now().Sub(g.start); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				runErr = context.Cause(ctx)
				break schedule
			}
		}
		delayed := false
		select {
		case slots <- struct{}{}:
		default:
			delayed = true
			sum.CapDelayed++
			if g.cfg.OnCapWait != nil {
				g.cfg.OnCapWait(i)
			}
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				runErr = context.Cause(ctx)
				break schedule
			}
		}
		sent++
		wg.Add(1)
		go func(i int, due time.Duration, delayed bool) {
			defer wg.Done()
			defer func() { <-slots }()
			res := g.send(ctx, i, due)
			res.CapDelayed = delayed
			sum.Results[i] = res
			if g.cfg.Progress != nil {
				g.cfg.Progress(res)
			}
			if g.cfg.Stop != nil {
				if err := g.cfg.Stop(res); err != nil && stopped.CompareAndSwap(nil, &err) {
					cancel(err)
				}
			}
		}(i, due, delayed)
	}
	wg.Wait()
	if err := stopped.Load(); runErr == nil && err != nil {
		runErr = *err // Stop fired after the last send: the run still failed
	}
	sum.Sent = sent
	for i := sent; i < len(sum.Results); i++ {
		sum.Results[i] = Result{Index: i, Err: fmt.Errorf("not sent: %w", runErr)}
	}
	sum.Elapsed = g.now().Sub(g.start)
	if runErr != nil {
		return sum, fmt.Errorf("load run stopped after %d of %d requests: %w", sent, len(g.cfg.Requests), runErr)
	}
	return sum, nil
}
