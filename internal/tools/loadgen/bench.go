package loadgen

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hedgerow/hedgerow/client"
	"github.com/hedgerow/hedgerow/internal/redact"
	"github.com/hedgerow/hedgerow/schemas"
)

// Defaults of the optional BenchOptions fields.
const (
	DefaultBenchModel     = "general"
	DefaultBenchPrompt    = "Say hello"
	DefaultBenchMaxTokens = 20
	DefaultBenchTimeout   = 30 * time.Second
)

// Names of a bench's targets in its report.
const (
	TargetGateway = "gateway"
	TargetDirect  = "direct"
)

// ErrUnauthorized is wrapped by the error Bench returns when the gateway
// refused a request for want of a valid API key (401, over either door):
// no later request can fare better, so the run stops at the first one.
var ErrUnauthorized = errors.New("the gateway answered 401: it needs a tenant's API key")

// BenchOptions describe one `hedgerow bench` run: an open-loop Poisson load
// against a running gateway, optionally side by side with one of its routes
// called directly.
type BenchOptions struct {
	// URL is the root of the gateway's HTTP front door; NATS is a client of
	// its NATS front door, NATSURL where that client is connected (for the
	// report). Exactly one of URL and NATS is set.
	URL     string
	NATS    *client.Client
	NATSURL string
	// APIKey is sent to the HTTP front door as a bearer token when set;
	// a NATS client sends its own (client.WithAPIKey).
	APIKey string
	// CompareDirect, when set, is the root of an OpenAI-compatible server
	// the gateway routes to (e.g. `hedgerow fakellm --instant 20`): every
	// arrival goes to the gateway or straight there, by a seeded coin, so
	// both see one load pattern interleaved in one run and the report
	// shows what the whole gateway path adds, quantile by quantile.
	CompareDirect string
	// DirectModel is the model named to the direct route; empty means Model.
	DirectModel string
	// Model is the pool (model class) asked for; empty: DefaultBenchModel.
	// Operation is the operation class; empty: the gateway's default.
	Model     string
	Operation string
	// Prompt starts every request's user message (each adds its number, so
	// requests differ); empty: DefaultBenchPrompt. MaxTokens caps the answer
	// (0: DefaultBenchMaxTokens).
	Prompt    string
	MaxTokens int
	Stream    bool
	// Rate is the Poisson arrival rate per target, per second; Duration how
	// long the measured run sends; Warmup how long an unmeasured run at the
	// same rate goes first (connections, pools and estimators warm up).
	Rate     float64
	Duration time.Duration
	Warmup   time.Duration
	// Timeout is each request's client deadline (0: DefaultBenchTimeout).
	Timeout     time.Duration
	Seed        uint64
	MaxInFlight int
	// Progress, when set, is told of every finished request, warm-up
	// included; it must not block.
	Progress func(Result)
}

// Percentiles of a latency distribution, in milliseconds.
type Percentiles struct {
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	P999 float64 `json:"p99_9_ms"`
	Max  float64 `json:"max_ms"`
}

// PercentilesOf returns the nearest-rank percentiles of ds (zero when ds is
// empty). ds is sorted in place.
func PercentilesOf(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	slices.Sort(ds)
	at := func(q float64) float64 {
		i := max(int(math.Ceil(q*float64(len(ds))))-1, 0)
		return float64(ds[i]) / float64(time.Millisecond)
	}
	return Percentiles{P50: at(0.50), P90: at(0.90), P99: at(0.99), P999: at(0.999), Max: at(1)}
}

// minus is p − o, quantile by quantile.
func (p Percentiles) minus(o Percentiles) Percentiles {
	return Percentiles{P50: p.P50 - o.P50, P90: p.P90 - o.P90, P99: p.P99 - o.P99, P999: p.P999 - o.P999, Max: p.Max - o.Max}
}

// TargetReport is what one target measured. Latencies run from when a
// request was due to the end of its answer, for successful requests only.
type TargetReport struct {
	Name     string `json:"name"`
	Via      string `json:"via"` // http or nats
	Address  string `json:"address"`
	Requests int    `json:"requests"`
	OK       int    `json:"ok"`
	Errors   int    `json:"errors"`
	// ErrorsByKind counts failures by HTTP status and code, client error
	// code, stream error, timeout or transport failure.
	ErrorsByKind map[string]int `json:"errors_by_kind,omitempty"`
	Hedged       int            `json:"hedged"`
	Latency      Percentiles    `json:"latency"`
	// FirstToken is the time to the first content token (streams only).
	FirstToken *Percentiles `json:"first_token,omitempty"`
}

// BenchReport is the outcome of a bench run.
type BenchReport struct {
	RatePerTarget float64 `json:"rate_per_target"`
	DurationS     float64 `json:"duration_s"`
	WarmupS       float64 `json:"warmup_s"`
	Stream        bool    `json:"stream"`
	MaxTokens     int     `json:"max_tokens"`
	Seed          uint64  `json:"seed"`
	ElapsedS      float64 `json:"elapsed_s"`
	// CapDelayed counts sends the in-flight cap held back: when nonzero the
	// load was not fully open-loop and the generator, not the server, is the
	// bottleneck.
	CapDelayed int           `json:"cap_delayed"`
	Gateway    TargetReport  `json:"gateway"`
	Direct     *TargetReport `json:"direct,omitempty"`
	// Added is the gateway's latency minus the direct route's, quantile by
	// quantile: what the whole gateway path adds.
	Added *Percentiles `json:"added,omitempty"`
}

// Bench runs the warm-up, then the measured run, and reports.
func Bench(ctx context.Context, o BenchOptions) (*BenchReport, error) {
	if (o.URL == "") == (o.NATS == nil) {
		return nil, fmt.Errorf("%w: bench needs exactly one of a gateway URL and a NATS client", ErrInvalidOptions)
	}
	if !(o.Rate > 0) || math.IsInf(o.Rate, 0) || o.Duration <= 0 || o.Warmup < 0 || o.MaxTokens < 0 || o.Timeout < 0 {
		return nil, fmt.Errorf("%w: rate %v and duration %v must be positive; warm-up %v, max tokens %d and timeout %v not negative",
			ErrInvalidOptions, o.Rate, o.Duration, o.Warmup, o.MaxTokens, o.Timeout)
	}
	o.Model = cmp.Or(o.Model, DefaultBenchModel)
	o.DirectModel = cmp.Or(o.DirectModel, o.Model)
	o.Prompt = cmp.Or(o.Prompt, DefaultBenchPrompt)
	if o.MaxTokens == 0 {
		o.MaxTokens = DefaultBenchMaxTokens
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultBenchTimeout
	}
	httpClient := NewClient(o.MaxInFlight)
	defer httpClient.CloseIdleConnections()

	rep := &BenchReport{RatePerTarget: o.Rate, DurationS: o.Duration.Seconds(), WarmupS: o.Warmup.Seconds(),
		Stream: o.Stream, MaxTokens: o.MaxTokens, Seed: o.Seed}
	var (
		targets []Target
		kinds   []string
		err     error
	)
	if o.NATS != nil {
		targets = append(targets, NewNATSTarget(o.NATS))
		kinds = append(kinds, "nats")
		rep.Gateway = TargetReport{Name: TargetGateway, Via: "nats", Address: redact.Text(o.NATSURL)}
	} else {
		t, err := NewHTTPTarget(o.URL, "", o.APIKey, httpClient)
		if err != nil {
			return nil, redact.Error(err)
		}
		targets = append(targets, t)
		kinds = append(kinds, "http")
		rep.Gateway = TargetReport{Name: TargetGateway, Via: "http", Address: redact.URL(o.URL)}
	}
	if o.CompareDirect != "" {
		t, err := NewHTTPTarget(o.CompareDirect, "", "", httpClient)
		if err != nil {
			return nil, fmt.Errorf("direct route: %w", redact.Error(err))
		}
		targets = append(targets, t)
		kinds = append(kinds, "direct")
		rep.Direct = &TargetReport{Name: TargetDirect, Via: "http", Address: redact.URL(o.CompareDirect)}
	}
	total := o.Rate * float64(len(targets)) // arrivals per second, all targets
	run := func(d time.Duration, seed uint64) (*Summary, error) {
		n := int(math.Round(total * d.Seconds()))
		reqs, err := benchRequests(o, kinds, n, seed)
		if err != nil {
			return nil, err
		}
		return Run(ctx, Options{Targets: targets, Requests: reqs, Rate: total, Seed: seed, Timeout: o.Timeout,
			MaxInFlight: o.MaxInFlight, Progress: o.Progress, Stop: stopUnauthorized})
	}
	if o.Warmup > 0 {
		if _, err = run(o.Warmup, o.Seed^0x5bd1e995); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	sum, err := run(o.Duration, o.Seed)
	if err != nil {
		return nil, err
	}
	rep.ElapsedS, rep.CapDelayed = sum.Elapsed.Seconds(), sum.CapDelayed
	summarize(&rep.Gateway, sum, 0, o.Stream)
	if rep.Direct != nil {
		summarize(rep.Direct, sum, 1, o.Stream)
		added := rep.Gateway.Latency.minus(rep.Direct.Latency)
		rep.Added = &added
	}
	return rep, nil
}

// stopUnauthorized stops a run at the gateway's first 401.
func stopUnauthorized(res Result) error {
	if res.Target != 0 || res.Status != http.StatusUnauthorized {
		return nil
	}
	return fmt.Errorf("%w (%s)", ErrUnauthorized, errorKind(res.Err))
}

// benchRequests builds n requests, each sent to a target a seeded coin
// picks (with one target, always it), in that target's wire form.
func benchRequests(o BenchOptions, kinds []string, n int, seed uint64) ([]Request, error) {
	coin := rand.New(rand.NewPCG(seed, seed^0xc2b2ae3d27d4eb4f))
	reqs := make([]Request, n)
	for i := range reqs {
		target := 0
		if len(kinds) > 1 {
			target = coin.IntN(len(kinds))
		}
		chat := schemas.ChatRequest{
			Messages:  []schemas.Message{{Role: schemas.MessageUser, Content: schemas.TextContent(o.Prompt + " #" + strconv.Itoa(i))}},
			MaxTokens: o.MaxTokens,
			Stream:    o.Stream,
		}
		var (
			body   []byte
			header http.Header
			err    error
		)
		switch kinds[target] {
		case "nats":
			body, err = json.Marshal(schemas.SubmitRequest{OperationClass: o.Operation, ModelClass: o.Model, Request: chat})
		case "http":
			chat.Model = o.Model
			body, err = json.Marshal(chat)
			if o.Operation != "" {
				header = http.Header{"X-Hedgerow-Operation": {o.Operation}}
			}
		default: // the direct route
			chat.Model = o.DirectModel
			body, err = json.Marshal(chat)
		}
		if err != nil {
			return nil, fmt.Errorf("encode request %d: %w", i, err)
		}
		reqs[i] = Request{Body: body, Header: header, Target: target}
	}
	return reqs, nil
}

// TargetOf is what target t (an index of Options.Targets) of a run
// measured, for a caller that runs its own targets through Run; Name, Via
// and Address are left to it. stream reports the time to the first token.
func TargetOf(sum *Summary, t int, stream bool) TargetReport {
	var r TargetReport
	summarize(&r, sum, t, stream)
	return r
}

// summarize fills r from the results of target t.
func summarize(r *TargetReport, sum *Summary, t int, stream bool) {
	var total, first []time.Duration
	for _, res := range sum.Results {
		if res.Target != t {
			continue
		}
		r.Requests++
		if res.Err != nil {
			r.Errors++
			if r.ErrorsByKind == nil {
				r.ErrorsByKind = map[string]int{}
			}
			r.ErrorsByKind[errorKind(res.Err)]++
			continue
		}
		r.OK++
		if res.Hedge.Hedged {
			r.Hedged++
		}
		total = append(total, res.Total)
		if res.FirstToken > 0 {
			first = append(first, res.FirstToken)
		}
	}
	r.Latency = PercentilesOf(total)
	if stream {
		p := PercentilesOf(first)
		r.FirstToken = &p
	}
}

// errorKind names a failure without anything request-specific in it.
func errorKind(err error) string {
	var (
		se   *StatusError
		ev   *StreamError
		herr *client.Error
	)
	switch {
	case errors.As(err, &herr):
		return fmt.Sprintf("%s (%d)", herr.Code, herr.Status)
	case errors.As(err, &se):
		return strings.TrimSpace(fmt.Sprintf("HTTP %d %s", se.Status, se.Code))
	case errors.As(err, &ev):
		return "stream error " + ev.Code
	case errors.Is(err, ErrIncomplete):
		return "incomplete answer"
	case errors.Is(err, client.ErrStreamBroken):
		return "stream broken"
	case errors.Is(err, context.DeadlineExceeded):
		return "client timeout"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	}
	return "transport error"
}

// WriteTable prints the report as a table, the added latency last.
func (r *BenchReport) WriteTable(w io.Writer) error {
	mode := "non-streaming"
	if r.Stream {
		mode = "streaming"
	}
	if _, err := fmt.Fprintf(w, "hedgerow bench: %g requests/s per target for %gs (open loop, Poisson; %gs warm-up), %s, max_tokens %d\n\n",
		r.RatePerTarget, r.DurationS, r.WarmupS, mode, r.MaxTokens); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\tvia\trequests\tok\terrors\thedged\tp50 ms\tp90 ms\tp99 ms\tp99.9 ms\tmax ms\t")
	row := func(name, via string, n, ok, errs, hedged string, p Percentiles) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t\n", name, via, n, ok, errs, hedged, p.P50, p.P90, p.P99, p.P999, p.Max)
	}
	targets := []*TargetReport{&r.Gateway}
	if r.Direct != nil {
		targets = append(targets, r.Direct)
	}
	for _, t := range targets {
		row(t.Name, t.Via, strconv.Itoa(t.Requests), strconv.Itoa(t.OK), strconv.Itoa(t.Errors), strconv.Itoa(t.Hedged), t.Latency)
		if t.FirstToken != nil {
			row("  first token", "", "", "", "", "", *t.FirstToken)
		}
	}
	if r.Added != nil {
		row("added by the gateway", "", "", "", "", "", *r.Added)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var notes []string
	for _, t := range targets {
		notes = append(notes, fmt.Sprintf("%s: %s", t.Name, t.Address))
		kinds := make([]string, 0, len(t.ErrorsByKind))
		for k := range t.ErrorsByKind {
			kinds = append(kinds, k)
		}
		sort.Strings(kinds)
		for _, k := range kinds {
			notes = append(notes, fmt.Sprintf("  %s errors: %d × %s", t.Name, t.ErrorsByKind[k], k))
		}
	}
	notes = append(notes, fmt.Sprintf("latency: from each request's due time to the end of its answer, successes only; %d sends held back by the in-flight cap", r.CapDelayed))
	_, err := fmt.Fprintf(w, "\n%s\n", strings.Join(notes, "\n"))
	return err
}
