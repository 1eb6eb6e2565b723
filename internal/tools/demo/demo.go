// Package demo runs `hedgerow demo`: the live system under load, primary-only
// against hedged, measured (docs/architecture.md §2).
//
// It starts three fake LLM routes of one workload on loopback, `serve` in
// front of them (embedded NATS, a worker per route, the gateway), and an
// independent subscriber of the attempt and group records on a connection of
// its own. A warm-up teaches the hedge-delay estimator the routes' latency;
// then one seeded sequence of streaming requests — the same bodies at the
// same Poisson arrival offsets — runs once under a primary-only operation
// class and once under a hedged one, open-loop through the OpenAI-compatible
// HTTP front door (package loadgen).
//
// Each run is reported in the shape of `hedgerow simulate --json`, with the
// primary-only run as strategy "none" and the hedged one as "hedgerow".
// Latencies are the client's time to the first committed token, converted to
// model time (real ÷ time scale) so they compare with `hedgerow simulate
// --stream` and docs/architecture.md §11's reference figures. Three figures are added:
// the P99 of commit → upstream disconnect of cancelled losers (real ms, from
// the fakes' own records), the output tokens billed to attempts that did not
// win (the fakes' billing, cancellation lag included), and the double
// commits the independent subscriber saw.
package demo

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"time"

	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/internal/tools/loadgen"
	"github.com/hedgerow/hedgerow/report"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// ErrInvalidOptions is wrapped by every error about the Options themselves.
var ErrInvalidOptions = errors.New("invalid demo options")

// Options select one demo run.
type Options struct {
	// Requests is the length of the measured sequence, run once per class.
	Requests int
	// Warmup is how many hedged requests run first, unmeasured, so the
	// hedge-delay estimator has learned the routes' latency.
	Warmup int
	// Rate is the Poisson arrival rate, per real second.
	Rate float64
	// TimeScale is real seconds per model second (0.02: the model runs 50×
	// faster than real time).
	TimeScale float64
	// Seed seeds the workload (shared by the three routes, each playing its
	// own route number) and the arrival gaps.
	Seed uint64
	// Workload names the fake routes' model (workload.Names).
	Workload string
	// OpenEarly makes the fake routes open every stream at once and send
	// its first token at the drawn first byte (fakellm.Options.OpenEarly),
	// as real providers do: the hedge trigger must then tell an open
	// stream from a producing one.
	OpenEarly bool
	// Progress, when set, is told of finished requests in batches (the
	// argument is how many finished since the last call), from any
	// goroutine; the total is Warmup + 2 × Requests.
	Progress func(requests int)
	// Logger receives the live system's logs; nil discards them.
	Logger *slog.Logger
}

// DefaultOptions are the issue's: 3,000 requests after a 600-request
// warm-up, Poisson 100 requests/s, time scale 0.02, seed 1, gpt4o.
func DefaultOptions() Options {
	return Options{Requests: 3000, Warmup: 600, Rate: 100, TimeScale: 0.02, Seed: 1, Workload: workload.GPT4o}
}

func (o Options) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidOptions, fmt.Sprintf(format, args...))
	}
	switch {
	case o.Requests < 1:
		return bad("requests must be at least 1, got %d", o.Requests)
	case o.Warmup < 0:
		return bad("warm-up must not be negative, got %d", o.Warmup)
	case !(o.Rate > 0) || math.IsInf(o.Rate, 0):
		return bad("rate %v per second must be finite and > 0", o.Rate)
	case !(o.TimeScale > 0) || o.TimeScale > 1:
		return bad("time scale %v must be in (0, 1]", o.TimeScale)
	}
	// The scaled minimum delay must stay a positive duration.
	if time.Duration(float64(100*time.Millisecond)*o.TimeScale) < time.Microsecond {
		return bad("time scale %v is too small to run the model in real time", o.TimeScale)
	}
	if _, err := workload.ByName(o.Workload); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	return nil
}

// Report is the demo's outcome: the object `hedgerow simulate --json`
// prints, with strategies "none" (primary-only) and "hedgerow" (hedged)
// whose times are model milliseconds, plus the live system's own figures.
type Report struct {
	simulator.Report
	// TimeScale converts the strategies' model milliseconds to real ones.
	TimeScale float64 `json:"time_scale"`
	// OpenEarly says the fake routes opened their streams before the first
	// token (Options.OpenEarly).
	OpenEarly bool `json:"open_early"`
	// CancelLatencyP99Ms is the P99, in real milliseconds, of commit →
	// upstream disconnect over every loser of a committed group that the
	// provider saw disconnect (both measured runs).
	CancelLatencyP99Ms float64 `json:"cancel_latency_p99_ms"`
	// CancelLatencyP50Ms and CancelLatencyMaxMs frame the P99: with a few
	// hundred cancelled losers per run the P99 is close to the maximum.
	CancelLatencyP50Ms float64 `json:"cancel_latency_p50_ms"`
	CancelLatencyMaxMs float64 `json:"cancel_latency_max_ms"`
	// LoserOutputTokens is the output the providers billed to attempts that
	// did not win, the cancellation lag included (both measured runs).
	LoserOutputTokens int64 `json:"loser_output_tokens"`
	// TailGain is the primary-only run's P99 over the hedged run's, with
	// its seeded bootstrap interval (report.TailGain: the runs' latencies
	// resampled apart, though they share bodies and arrivals); nil, and
	// TailGainWithheld says why, below 100 requests a run.
	TailGain         *report.Gain `json:"tail_gain,omitempty"`
	TailGainWithheld string       `json:"tail_gain_withheld,omitempty"`
	// Windows is what the strategies' max_window_* rates were taken over:
	// the gateway's duplicate windows, in real time.
	Windows Windows `json:"duplicate_windows"`
	// HostCPUs and LoadAverage (1 minute, at the runs' end; nil where the
	// host keeps none) say how busy the host was: every part of the demo
	// runs in this one process and waits for CPU with the rest.
	HostCPUs    int      `json:"host_cpus"`
	LoadAverage *float64 `json:"load_average_1m,omitempty"`
	// DoubleCommits counts, over every record the independent subscriber
	// saw (warm-up included), user actions with more than one committed
	// group record and groups with more than one winning attempt record.
	DoubleCommits int `json:"double_commits"`

	// Warmup is the warm-up's length; Runs checks each run's bookkeeping;
	// CancelledLosers is how many latencies CancelLatencyP99Ms is taken
	// over; RecordsSeen counts the subscriber's group and attempt records.
	Warmup          int        `json:"-"`
	Rate            float64    `json:"-"`
	Runs            []RunCheck `json:"-"`
	CancelledLosers int        `json:"-"`
	GroupRecords    int        `json:"-"`
	AttemptRecords  int        `json:"-"`
	// BadRecords counts records the subscriber could not decode; the
	// double-commit count is only as good as it is zero.
	BadRecords int `json:"-"`
}

// RunCheck is the bookkeeping of one run: whether every request was seen
// by every observer.
type RunCheck struct {
	Name     string
	Requests int
	// GroupsSeen counts requests with a group record; UpstreamRecords the
	// fakes' records joined to the run's requests.
	GroupsSeen      int
	UpstreamRecords int
	// Stray counts fake records of the run's bodies that started before the
	// run did: attempts of an earlier run that reached the provider late
	// (only an overloaded system does that). They are left out.
	Stray int
	// CapDelayed counts sends the load generator's in-flight cap held back.
	CapDelayed int
	// ClientErrors counts requests that did not end in a complete stream.
	ClientErrors int
}

// Run starts the live system, runs the warm-up and both measured runs, and
// stops everything before returning.
func Run(ctx context.Context, o Options) (rep *Report, err error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key) // crypto/rand.Read never fails
	cl, err := startCluster(o, key, log)
	if err != nil {
		return nil, err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		if serr := cl.stop(stopCtx); serr != nil {
			err = errors.Join(err, serr)
		}
	}()
	rec, err := startRecorder(cl.serve.NATSURL(), cl.observerSeed())
	if err != nil {
		return nil, err
	}
	defer rec.close()
	up := newUpstream(cl.baseURLs())
	defer up.close()

	client := loadgen.NewClient(loadgen.DefaultMaxInFlight)
	defer client.CloseIdleConnections()
	r := &runner{o: o, key: key, rec: rec, up: up, client: client,
		baseURL: "http://" + cl.serve.HTTPAddr().String(), deadline: scaled(modelDeadline, o.TimeScale)}

	plan := []struct {
		name, class, prompt string
		n                   int
	}{
		{"warmup", classHedged, "Warm-up request", o.Warmup},
		{simulator.StrategyNone, classPrimary, "Request", o.Requests},
		{simulator.StrategyHedgerow, classHedged, "Request", o.Requests},
	}
	var runs []*run
	for _, p := range plan {
		if p.n == 0 {
			continue
		}
		ru, err := r.run(ctx, p.name, p.class, p.prompt, p.n)
		if err != nil {
			return nil, fmt.Errorf("%s run: %w", p.name, err)
		}
		runs = append(runs, ru)
	}
	return r.report(runs), nil
}

// stopTimeout bounds the shutdown of the live system.
const stopTimeout = 15 * time.Second

// drainTimeout bounds the wait, after a run's last response, for its group
// records and for the fakes to let go of its last attempts: a group lives
// on after its answer until its losers are recorded (the engine's cancel
// grace, 2 s real).
const drainTimeout = 10 * time.Second

func scaled(d time.Duration, scale float64) time.Duration {
	return time.Duration(float64(d) * scale)
}

// runner holds what every run of one demo shares.
type runner struct {
	o        Options
	key      []byte
	rec      *recorder
	up       *upstream
	client   *http.Client
	baseURL  string
	deadline time.Duration // real
}

// run is one run's requests and what each observer said about them.
type run struct {
	name     string
	sum      *loadgen.Summary
	groups   []*schemas.GroupRecord // by request; nil: none seen
	upstream [][]fakellm.Record     // by request
	check    RunCheck
}

// run sends n requests of one operation class and gathers their records.
func (r *runner) run(ctx context.Context, name, class, prompt string, n int) (*run, error) {
	reqs := make([]loadgen.Request, n)
	uas := make([]string, n)
	ids := make(map[uint64]int, n)
	for i := range reqs {
		chat := schemas.ChatRequest{
			Model:    poolName,
			Messages: []schemas.Message{{Role: schemas.MessageUser, Content: schemas.TextContent(fmt.Sprintf("%s %d of the hedgerow demo.", prompt, i))}},
			Stream:   true,
		}
		body, err := json.Marshal(chat)
		if err != nil {
			return nil, fmt.Errorf("encode request %d: %w", i, err)
		}
		id, err := fakellm.RequestID(chat.Messages, chat.MaxTokens)
		if err != nil {
			return nil, err
		}
		ids[id] = i
		// A user action per request and run: the same body in two runs is
		// two actions, or the winner gate would refuse the second.
		idem := fmt.Sprintf("demo-%s-%d", name, i)
		uas[i] = schemas.UserActionID(r.key, "", idem)
		reqs[i] = loadgen.Request{Body: body, Header: http.Header{
			frontdoor.HeaderOperation:      {class},
			frontdoor.HeaderIdempotencyKey: {idem},
		}}
	}
	cfg := loadgen.Options{
		BaseURL: r.baseURL, Requests: reqs, Rate: r.o.Rate, Seed: r.o.Seed, Client: r.client,
		// Longer than the group's deadline, so the gateway, not the client,
		// ends a group that runs out of time.
		Timeout: r.deadline + 5*time.Second,
	}
	if r.o.Progress != nil {
		cfg.Progress = func(loadgen.Result) { r.o.Progress(1) }
	}
	sum, err := loadgen.Run(ctx, cfg)
	if err != nil {
		return nil, err
	}
	ru := &run{name: name, sum: sum, groups: make([]*schemas.GroupRecord, n), upstream: make([][]fakellm.Record, n)}
	ru.check = RunCheck{Name: name, Requests: n, CapDelayed: sum.CapDelayed}
	for _, res := range sum.Results {
		if res.Err != nil {
			ru.check.ClientErrors++
		}
	}
	if _, err := r.rec.waitGroups(ctx, uas, drainTimeout); err != nil {
		return nil, err
	}
	for i, ua := range uas {
		ru.groups[i], _ = r.rec.group(ua)
		if ru.groups[i] != nil {
			ru.check.GroupsSeen++
		}
	}
	byRoute, err := r.up.collect(ctx, drainTimeout)
	if err != nil {
		return nil, err
	}
	unmatched, started := 0, sum.Start.UnixMilli()
	for _, recs := range byRoute {
		for _, rec := range recs {
			i, ok := ids[rec.RequestID]
			if !ok {
				unmatched++
				continue
			}
			if rec.StartUnixMs < started {
				ru.check.Stray++
				continue
			}
			ru.upstream[i] = append(ru.upstream[i], rec)
			ru.check.UpstreamRecords++
		}
	}
	if unmatched > 0 {
		return nil, fmt.Errorf("%d of the fake routes' records match no request of the run: "+
			"the demo's request ids no longer follow the fake LLM's derivation", unmatched)
	}
	return ru, nil
}
