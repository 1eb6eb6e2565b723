package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/internal/tools/hostload"
	"github.com/hedgerow/hedgerow/internal/tools/loadgen"
)

// Names of the targets and parts in the report.
const (
	nameDirect   = "direct"
	nameHedgerow = "hedgerow"
	nameProxy    = "proxy"
)

// Request timeouts: the added-latency run's, and a search step's (it
// bounds how long a step the target cannot keep up with drains).
const (
	latencyTimeout = 10 * time.Second
	stepTimeout    = 2 * time.Second
)

// target is where one share of a load goes: a server speaking OpenAI chat
// completions at base, asked for model.
type target struct {
	name, base, model string
	header            http.Header
}

func (b *bench) direct() target { return target{name: nameDirect, base: b.fakeURL, model: "instant"} }
func (b *bench) hedgerow() target {
	return target{name: nameHedgerow, base: b.serveURL, model: "general"}
}
func (b *bench) proxyTarget() target {
	return target{name: nameProxy, base: b.proxyURL, model: "instant"}
}

// loadRun is what one measured load run found.
type loadRun struct {
	rate       float64 // per target
	targets    []loadgen.TargetReport
	capDelayed int
	cpu        map[string]time.Duration // by part, over the measured window
	// commitWait is serve's wait for its commit records' acks, and the
	// records' batch messages, over the measured window (nil when
	// hedgerow was not a target).
	commitWait *recordsSeen
	elapsed    time.Duration
	load       string // load average at its end
}

// report returns the report of the named target.
func (r *loadRun) report(name string) loadgen.TargetReport {
	for _, t := range r.targets {
		if t.Name == name {
			return t
		}
	}
	return loadgen.TargetReport{}
}

// cpuPerRequest is the part's CPU over the window divided by requests.
func (r *loadRun) cpuPerRequest(part string, requests int) time.Duration {
	if requests == 0 {
		return 0
	}
	return r.cpu[part] / time.Duration(requests)
}

// load runs an open-loop Poisson load of rate per target, each arrival
// sent to a target a seeded coin picks: an unmeasured warm-up, then the
// measured run, over which it meters every part's CPU.
func (b *bench) load(ctx context.Context, ts []target, rate float64, stream bool, warmup, duration, timeout time.Duration, seed uint64) (*loadRun, error) {
	client := loadgen.NewClient(loadgen.DefaultMaxInFlight)
	defer client.CloseIdleConnections()
	lts := make([]loadgen.Target, len(ts))
	for i, t := range ts {
		lt, err := loadgen.NewHTTPTarget(t.base, "", "", client)
		if err != nil {
			return nil, err
		}
		lts[i] = lt
	}
	total := rate * float64(len(ts))
	run := func(d time.Duration, seed uint64) (*loadgen.Summary, error) {
		reqs, err := requests(ts, int(math.Round(total*d.Seconds())), stream, seed)
		if err != nil {
			return nil, err
		}
		return loadgen.Run(ctx, loadgen.Options{Targets: lts, Requests: reqs, Rate: total, Seed: seed, Timeout: timeout})
	}
	if warmup > 0 {
		if _, err := run(warmup, seed^0x5bd1e995); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	withHedgerow := slices.ContainsFunc(ts, func(t target) bool { return t.name == nameHedgerow })
	metrics := b.internalURL + "/metrics"
	var before recordsSeen
	if withHedgerow {
		var err error
		if before, err = scrapeRecords(ctx, metrics); err != nil {
			return nil, err
		}
	}
	meter, err := newCPUMeter(map[string]int{"serve": b.serve.pid(), "proxyfloor": b.proxy.pid(), "fakellm": b.fake.pid()})
	if err != nil {
		return nil, err
	}
	sum, err := run(duration, seed)
	if err != nil {
		return nil, err
	}
	out := &loadRun{rate: rate, capDelayed: sum.CapDelayed, elapsed: sum.Elapsed, load: hostload.Averages()}
	if out.cpu, err = meter.spent(); err != nil {
		return nil, err
	}
	if withHedgerow {
		after, err := scrapeRecords(ctx, metrics)
		if err != nil {
			return nil, err
		}
		out.commitWait = &recordsSeen{wait: after.wait.minus(before.wait), batches: after.batches.minus(before.batches)}
	}
	for i, t := range ts {
		r := loadgen.TargetOf(sum, i, stream)
		r.Name, r.Via, r.Address = t.name, "http", t.base
		out.targets = append(out.targets, r)
	}
	return out, nil
}

// requests builds n chat requests of 20 tokens, each to a target a seeded
// coin picks (always the one, with one), every prompt its own.
func requests(ts []target, n int, stream bool, seed uint64) ([]loadgen.Request, error) {
	coin := rand.New(rand.NewPCG(seed, seed^0xc2b2ae3d27d4eb4f))
	out := make([]loadgen.Request, n)
	for i := range out {
		t := 0
		if len(ts) > 1 {
			t = coin.IntN(len(ts))
		}
		body, err := chatBody(ts[t].model, fmt.Sprintf("bench-path %d #%d", seed, i), stream)
		if err != nil {
			return nil, err
		}
		out[i] = loadgen.Request{Body: body, Header: ts[t].header, Target: t}
	}
	return out, nil
}

// chatBody is a chat completions request for 20 tokens.
func chatBody(model, prompt string, stream bool) ([]byte, error) {
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	body, err := json.Marshal(struct {
		Model     string    `json:"model"`
		Messages  []message `json:"messages"`
		MaxTokens int       `json:"max_tokens"`
		Stream    bool      `json:"stream,omitempty"`
	}{model, []message{{"user", prompt}}, loadgen.DefaultBenchMaxTokens, stream})
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	return body, nil
}

// latency measures what hedgerow and the proxy add at b.o.rate each over
// calling the fake directly, the three interleaved in one load.
func (b *bench) latency(ctx context.Context) (*loadRun, error) {
	b.step("added latency: direct, hedgerow and proxy interleaved, %g requests/s each, non-streaming 20 tokens, %v (after %v warm-up)",
		b.o.rate, b.s.latDuration, b.s.latWarmup)
	r, err := b.load(ctx, []target{b.direct(), b.hedgerow(), b.proxyTarget()}, b.o.rate, false, b.s.latWarmup, b.s.latDuration, latencyTimeout, b.o.seed)
	if err != nil {
		return nil, err
	}
	for _, t := range r.targets {
		b.step("  %-8s %6d requests, %d errors, %d hedged: p50 %.3f p99 %.3f p99.9 %.3f max %.3f ms", t.Name, t.Requests, t.Errors, t.Hedged,
			t.Latency.P50, t.Latency.P99, t.Latency.P999, t.Latency.Max)
	}
	b.step("  hedgerow's commit records, each answer waiting for its ack: %v", r.commitWait)
	if err := failures(r); err != nil {
		b.step("  %v", err) // reported, not fatal: the table counts them
	}
	return r, nil
}

// failures is an error naming a run's failed requests, if any.
func failures(r *loadRun) error {
	var msgs []string
	for _, t := range r.targets {
		for kind, n := range t.ErrorsByKind {
			msgs = append(msgs, fmt.Sprintf("%s: %d × %s", t.Name, n, kind))
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return fmt.Errorf("requests failed: %s", strings.Join(msgs, "; "))
}

// searchResult is one mode's step searches, hedgerow's and the proxy's.
type searchResult struct {
	stream          bool
	hedgerow, proxy *stepSearch
	// atBest is each target's step at its highest sustained rate.
	atBest map[string]*loadRun
}

// throughput runs hedgerow's and the proxy's step searches, one step of
// each in turn, so both meet the same machine.
func (b *bench) throughput(ctx context.Context, stream bool) (*searchResult, error) {
	mode := "non-streaming"
	if stream {
		mode = "streaming"
	}
	b.step("highest rate with p99 ≤ %v, %s 20 tokens: steps of %v (after %v warm-up), hedgerow and proxy in turn",
		b.o.bound, mode, b.s.stepDuration, b.s.stepWarmup)
	newSearch := func() *stepSearch {
		return &stepSearch{start: b.s.searchStart, min: b.s.searchMin, max: b.s.searchMax, refine: b.s.refine, resolution: 1.15}
	}
	res := &searchResult{stream: stream, hedgerow: newSearch(), proxy: newSearch(), atBest: map[string]*loadRun{}}
	searches := []struct {
		t    target
		s    *stepSearch
		part string
	}{{b.hedgerow(), res.hedgerow, "serve"}, {b.proxyTarget(), res.proxy, "proxyfloor"}}
	for seed := b.o.seed + 100; ; seed++ {
		stepped := false
		for _, sr := range searches {
			rate, more := sr.s.next()
			if !more {
				continue
			}
			stepped = true
			r, err := b.load(ctx, []target{sr.t}, rate, stream, b.s.stepWarmup, b.s.stepDuration, stepTimeout, seed)
			if err != nil {
				return nil, err
			}
			t := r.targets[0]
			ok, why := stepVerdict(t, r.capDelayed, b.o.bound)
			sr.s.record(rate, ok)
			if best, _ := sr.s.best(); ok && best == rate {
				res.atBest[sr.t.name] = r
			}
			b.step("  %-8s %6g/s: %6d requests, %d errors, %d held back: p50 %.3f p99 %.3f p99.9 %.3f ms; cpu %s %.3f ms/request, fakellm %.3f, bench %.3f — %s",
				sr.t.name, rate, t.Requests, t.Errors, r.capDelayed, t.Latency.P50, t.Latency.P99, t.Latency.P999,
				sr.part, ms(r.cpuPerRequest(sr.part, t.Requests)), ms(r.cpuPerRequest("fakellm", t.Requests)), ms(r.cpuPerRequest("bench", t.Requests)), why)
			if r.commitWait != nil {
				b.step("    commit records' acks: %v", r.commitWait)
			}
			if err := failures(r); err != nil {
				b.step("    %v", err)
			}
		}
		if !stepped {
			return res, nil
		}
	}
}

// cancelResult is one condition's cancel samples.
type cancelResult struct {
	loaded           bool
	hedgerow, direct []time.Duration
	// missed counts probes that left no sample, by kind and why;
	// examples are the first few in full.
	missed   map[string]int
	examples []string
	load     string
	// parts is what serve timed of the phase's cancels (its background
	// load's included).
	parts cancelParts
}

// cancels sends b.s.probes race probes through hedgerow and as many
// direct probes, alternating, one at a time; loaded, under b.o.rate of
// non-streaming load through hedgerow's pool general.
func (b *bench) cancels(ctx context.Context, loaded bool) (*cancelResult, error) {
	cond := "quiet"
	if loaded {
		cond = fmt.Sprintf("under %g requests/s through hedgerow", b.o.rate)
	}
	b.step("cancels, %s: %d hedged races through hedgerow and %d direct cancels, alternating, one at a time", cond, b.s.probes, b.s.probes)
	res := &cancelResult{loaded: loaded, missed: map[string]int{}}
	if loaded {
		bg, stop, err := b.background(ctx)
		if err != nil {
			return nil, err
		}
		defer func() {
			stop()
			<-bg
		}()
	}
	client := &http.Client{Transport: loadgen.NewClient(4).Transport}
	defer client.CloseIdleConnections()
	timings := &timingsReader{base: b.raceURL, client: client}
	if _, err := timings.fetch(ctx); err != nil { // skip what earlier phases left
		return nil, err
	}
	metrics := b.internalURL + "/metrics"
	before, err := scrapeCancelParts(ctx, metrics)
	if err != nil {
		return nil, err
	}
	for i := range b.s.probes {
		d, err := b.raceProbe(ctx, client, timings, i)
		if err := res.keep(ctx, nameHedgerow, d, err); err != nil {
			return nil, err
		}
		d, err = b.directProbe(ctx, client, timings, i)
		if err := res.keep(ctx, nameDirect, d, err); err != nil {
			return nil, err
		}
	}
	res.load = hostload.Averages()
	after, err := scrapeCancelParts(ctx, metrics)
	if err != nil {
		return nil, err
	}
	res.parts = after.minus(before)
	h, d := loadgen.PercentilesOf(append([]time.Duration(nil), res.hedgerow...)), loadgen.PercentilesOf(append([]time.Duration(nil), res.direct...))
	b.step("  hedgerow winner's token → loser's disconnect: %d samples, p50 %.3f p99 %.3f max %.3f ms", len(res.hedgerow), h.P50, h.P99, h.Max)
	b.step("  direct client cancel → provider sees it:     %d samples, p50 %.3f p99 %.3f max %.3f ms", len(res.direct), d.P50, d.P99, d.Max)
	b.step("  parts serve timed: dispatcher, deciding reply → cancel published: %v; worker, cancel → provider call returned: %v", res.parts.dispatch, res.parts.worker)
	for why, n := range res.missed {
		b.step("  no sample: %d × %s", n, why)
	}
	for _, e := range res.examples {
		b.step("    e.g. %s", e)
	}
	return res, nil
}

// maxExamples bounds the misses a phase prints in full.
const maxExamples = 3

// keep files a probe's outcome: a sample, a miss (counted by why), or a
// failure that ends the phase.
func (res *cancelResult) keep(ctx context.Context, kind string, d time.Duration, err error) error {
	if err == nil {
		if kind == nameHedgerow {
			res.hedgerow = append(res.hedgerow, d)
		} else {
			res.direct = append(res.direct, d)
		}
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	for _, why := range []error{errNoRace, errNotSeen, errTooEarly} {
		if errors.Is(err, why) {
			res.missed[kind+": "+why.Error()]++
			if len(res.examples) < maxExamples {
				res.examples = append(res.examples, kind+": "+err.Error())
			}
			return nil
		}
	}
	return fmt.Errorf("%s probe: %w", kind, err)
}

// raceProbe streams one request through hedgerow's pool race and reads
// the cancel its loser saw at the race fake.
func (b *bench) raceProbe(ctx context.Context, client *http.Client, timings *timingsReader, i int) (time.Duration, error) {
	body, err := chatBody("race", "bench-path race #"+strconv.Itoa(i), true)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.serveURL+loadgen.DefaultPath, strings.NewReader(string(body)))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Hedgerow-Operation", "race")
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("race request: %w", err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("race request: status %d: %v", resp.StatusCode, err)
	}
	ts, err := timings.await(ctx, 2, 2*time.Second)
	if err != nil {
		return 0, err
	}
	return raceSample(ts)
}

// directProbe sends the race fake a stream directly, cancels it while the
// fake waits for its first token, and reads when the fake saw it go.
func (b *bench) directProbe(ctx context.Context, client *http.Client, timings *timingsReader, i int) (time.Duration, error) {
	body, err := chatBody("instant", "bench-path direct #"+strconv.Itoa(i), true)
	if err != nil {
		return 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, b.raceURL+loadgen.DefaultPath, strings.NewReader(string(body)))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	done := make(chan error, 1)
	go func() {
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			err = errors.New("answered before its cancel")
		}
		done <- err
	}()
	select {
	case <-time.After(raceFirstToken / 3): // well before its first token
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	cancelled := time.Now().UnixMicro()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		return 0, fmt.Errorf("direct request: %w", err)
	}
	ts, err := timings.await(ctx, 1, 2*time.Second)
	if err != nil {
		return 0, err
	}
	return directSample(ts, cancelled)
}

// background runs b.o.rate of non-streaming load through hedgerow until
// stop is called (at most ten minutes), after a second's warm-up; done
// closes when it has ended.
func (b *bench) background(ctx context.Context) (done <-chan struct{}, stop func(), err error) {
	bctx, cancel := context.WithCancel(ctx)
	reqs, err := requests([]target{b.hedgerow()}, int(b.o.rate*600), false, b.o.seed+7)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	client := loadgen.NewClient(loadgen.DefaultMaxInFlight)
	lt, err := loadgen.NewHTTPTarget(b.serveURL, "", "", client)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		defer client.CloseIdleConnections()
		_, _ = loadgen.Run(bctx, loadgen.Options{Targets: []loadgen.Target{lt}, Requests: reqs, Rate: b.o.rate, Seed: b.o.seed + 7, Timeout: latencyTimeout})
	}()
	select {
	case <-time.After(time.Second):
	case <-ctx.Done():
		cancel()
		<-ch
		return nil, nil, ctx.Err()
	}
	return ch, cancel, nil
}

// profileResult is serve's CPU profile under load.
type profileResult struct {
	rate      float64
	file      string
	flat, cum string
	run       *loadRun
}

// profile takes a CPU profile of serve through its pprof endpoint while
// hedgerow carries rate of non-streaming load, and reads its top 10.
func (b *bench) profile(ctx context.Context, rate float64) (*profileResult, error) {
	secs := int(b.s.profile / time.Second)
	b.step("profile: serve's CPU for %ds at %g requests/s (non-streaming) through its pprof endpoint", secs, rate)
	res := &profileResult{rate: rate, file: filepath.Join(b.o.out, "serve-cpu.pprof")}
	type loaded struct {
		r   *loadRun
		err error
	}
	ch := make(chan loaded, 1)
	go func() {
		r, err := b.load(ctx, []target{b.hedgerow()}, rate, false, time.Second, b.s.profile+time.Second, stepTimeout, b.o.seed+9)
		ch <- loaded{r, err}
	}()
	select { // the profile starts once the measured load has
	case <-time.After(1500 * time.Millisecond):
	case <-ctx.Done():
		<-ch
		return nil, ctx.Err()
	}
	perr := get(ctx, b.internalURL+"/debug/pprof/profile?seconds="+strconv.Itoa(secs), res.file)
	l := <-ch
	if err := errors.Join(perr, l.err); err != nil {
		return nil, err
	}
	res.run = l.r
	t := l.r.targets[0]
	b.step("  hedgerow %d requests, %d errors: p50 %.3f p99 %.3f ms; serve %.3f ms CPU/request (the profiler's own cost included); commit records' acks %v",
		t.Requests, t.Errors, t.Latency.P50, t.Latency.P99, ms(l.r.cpuPerRequest("serve", t.Requests)), l.r.commitWait)
	var err error
	if res.flat, err = b.pprofTop(ctx, res.file, false); err != nil {
		return nil, err
	}
	if res.cum, err = b.pprofTop(ctx, res.file, true); err != nil {
		return nil, err
	}
	return res, nil
}

// ms is a duration in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
