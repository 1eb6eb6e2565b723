package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/node"
	"github.com/hedgerow/hedgerow/internal/tools/hostload"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// The pools of the run, both over the same three routes.
const (
	poolRescued = "rescued"
	poolPlain   = "plain"
)

// pools in the order the table shows them.
var pools = []string{poolRescued, poolPlain}

const (
	// apiKey is the run's tenant key; serve holds only its hash.
	apiKey = "sk-rescuerun-acme"
	// answerTokens is every answer's length: the model's output draw has no
	// spread.
	answerTokens = 24
	// maxTries bounds the plain pool's client: a stream_interrupted is sent
	// again at once, at most this many times in all.
	maxTries = 5
	// requestTimeout bounds one try; the policy's deadline is 10 s.
	requestTimeout = 20 * time.Second
	// stopTimeout bounds serve's shutdown.
	stopTimeout = 20 * time.Second
)

// routeModel is gpt4o without errors, hangs or stalls, its first token
// 0.2 model seconds in, its answers answerTokens long (internal/node's
// longModel).
func routeModel() (*workload.Model, error) {
	m, err := workload.ByName(workload.GPT4o)
	if err != nil {
		return nil, err
	}
	m.ErrorFraction = 0
	m.TTFT = workload.TTFT{Main: workload.LogNormalMedian(0.2, 0), Stall: workload.LogNormalMedian(0.2, 0)}
	m.OutputTokens = workload.LogNormal{Mu: math.Log(answerTokens)}
	return m, nil
}

// job is one request of the run: its pool, whether it streams, and the
// answer it must get.
type job struct {
	pool   string
	index  int
	id     uint64 // the request id the simulated routes derive from it
	stream bool
	body   []byte
	want   string // fakellm.FullText of its conversation
}

// poolResult is what one pool's requests of a fault came to.
type poolResult struct {
	requests int
	tries    int // requests sent, retries included
	// interrupted counts the streams the caller saw end stream_interrupted
	// (every try's), invalid the answers that are not the whole answer for
	// another reason (the last try's).
	interrupted int
	invalid     int
	// lost counts the plain pool's streams still interrupted after
	// maxTries tries (the rescued pool's interrupted streams are its
	// interrupted count: it does not retry).
	lost    int
	reasons map[string]int // why answers were invalid
	// routeBreaks counts the faulty route's broken exchanges of this
	// pool's requests, by whether the caller asked for a stream (the
	// worker streams from the provider either way).
	routeBreaks map[bool]int
	// streamEnds is every streaming request's time from its first try to
	// the end of its last; hitEnds the same for the streams the faulty
	// route broke (any try); completionEnds for the other requests.
	streamEnds     []time.Duration
	hitEnds        []time.Duration
	completionEnds []time.Duration
}

// faultResult is one fault's run.
type faultResult struct {
	fault fakellm.BreakMode
	pools map[string]*poolResult
	// rescues is hedgerow_rescues_total by outcome at the end of the
	// fault's run (serve runs one fault only).
	rescues map[string]float64
	// unattributed counts broken exchanges no request of the run explains.
	unattributed        int
	loadStart, loadEnd  string
	elapsed             time.Duration
	routeContinuations  int // continuation requests the routes answered
	routeContinuationOK int // of them, completed
}

// runFault runs the fault o.rounds times, each round on routes and a serve
// of its own, and adds the rounds up.
func runFault(ctx context.Context, o options, fault fakellm.BreakMode) (faultResult, error) {
	var sum faultResult
	for round := range o.rounds {
		r, err := runRound(ctx, o, fault, round)
		if err != nil {
			return sum, err
		}
		if round == 0 {
			sum = r
			continue
		}
		sum.add(r)
	}
	return sum, nil
}

// add adds round r's counts to res.
func (res *faultResult) add(r faultResult) {
	for name, p := range r.pools {
		q := res.pools[name]
		q.requests += p.requests
		q.tries += p.tries
		q.interrupted += p.interrupted
		q.invalid += p.invalid
		q.lost += p.lost
		for why, n := range p.reasons {
			q.reasons[why] += n
		}
		for stream, n := range p.routeBreaks {
			q.routeBreaks[stream] += n
		}
		q.streamEnds = append(q.streamEnds, p.streamEnds...)
		q.hitEnds = append(q.hitEnds, p.hitEnds...)
		q.completionEnds = append(q.completionEnds, p.completionEnds...)
	}
	for outcome, n := range r.rescues {
		res.rescues[outcome] += n
	}
	res.unattributed += r.unattributed
	res.routeContinuations += r.routeContinuations
	res.routeContinuationOK += r.routeContinuationOK
	res.loadEnd = r.loadEnd
	res.elapsed += r.elapsed
}

// runRound starts the three routes and serve, sends both pools their
// requests, a few at a time, and stops everything it started.
func runRound(ctx context.Context, o options, fault fakellm.BreakMode, round int) (res faultResult, err error) {
	res = faultResult{fault: fault, pools: map[string]*poolResult{}, loadStart: hostload.Averages()}
	began := time.Now()
	jobs, ids, err := makeJobs(o, fault, round)
	if err != nil {
		return res, err
	}
	for _, p := range pools {
		res.pools[p] = &poolResult{reasons: map[string]int{}, routeBreaks: map[bool]int{}}
	}

	var mu sync.Mutex          // guards res's counts from the routes' records, and broke
	broke := map[uint64]bool{} // the requests the faulty route broke, by id
	onRecord := func(rec fakellm.Record) {
		mu.Lock()
		defer mu.Unlock()
		if rec.Continuation != "" {
			res.routeContinuations++
			if rec.End == fakellm.EndCompleted {
				res.routeContinuationOK++
			}
			return
		}
		if rec.Break == "" {
			return
		}
		j, ok := ids[rec.RequestID]
		if !ok {
			res.unattributed++
			return
		}
		res.pools[j.pool].routeBreaks[j.stream]++
		broke[j.id] = true
	}
	routes, err := startRoutes(o, fault, onRecord)
	defer func() {
		for _, r := range routes {
			r.fake.Close()
			r.srv.Close() // waits for the handlers, and so their records
		}
	}()
	if err != nil {
		return res, err
	}
	serve, err := startServe(o, routes)
	if err != nil {
		return res, err
	}
	base := "http://" + serve.HTTPAddr().String()
	tr := &http.Transport{MaxIdleConnsPerHost: o.concurrency}
	client := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()

	results := make(chan jobResult, len(jobs))
	queue := make(chan job)
	var wg sync.WaitGroup
	for range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range queue {
				results <- send(ctx, client, base, j)
			}
		}()
	}
	for _, j := range jobs {
		queue <- j
	}
	close(queue)
	wg.Wait()
	close(results)

	rescues, metricsErr := readRescues(ctx, client, base)
	stopCtx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if err := errors.Join(metricsErr, serve.Stop(stopCtx)); err != nil {
		return res, err
	}
	for _, r := range routes {
		r.fake.Close()
		r.srv.Close()
	}
	routes = nil
	res.rescues = rescues
	mu.Lock() // the routes are closed: no record comes any more
	defer mu.Unlock()
	for r := range results {
		p := res.pools[r.job.pool]
		p.requests++
		p.tries += r.tries
		p.interrupted += r.interrupted
		switch {
		case r.why == "":
		case r.lastInterrupted:
			if r.job.pool == poolPlain {
				p.lost++
			}
		default:
			p.invalid++
			p.reasons[r.why]++
		}
		if r.job.stream {
			p.streamEnds = append(p.streamEnds, r.elapsed)
			if broke[r.job.id] {
				p.hitEnds = append(p.hitEnds, r.elapsed)
			}
		} else {
			p.completionEnds = append(p.completionEnds, r.elapsed)
		}
	}
	res.loadEnd, res.elapsed = hostload.Averages(), time.Since(began)
	return res, nil
}

// words are what the seeded prompts are made of.
var words = strings.Fields("hedge row stream token route pool answer commit splice break rescue provider " +
	"latency tail budget gate worker record deadline stall cut error model")

// makeJobs makes the fault's requests of a round, seeded: per pool, requests of
// which every other one streams, each its own conversation (so its own
// text), interleaved between the pools so that both meet the faulty route
// in the same state of its health. ids maps the request id the simulated
// routes derive from each request to its job.
func makeJobs(o options, fault fakellm.BreakMode, round int) (jobs []job, ids map[uint64]job, err error) {
	m, err := routeModel()
	if err != nil {
		return nil, nil, err
	}
	ids = map[uint64]job{}
	h := fnv.New64a()
	h.Write([]byte(fault))
	rng := rand.New(rand.NewPCG(o.seed, h.Sum64()+uint64(round)))
	for i := range o.requests {
		order := pools
		if i%2 == 1 {
			order = []string{pools[1], pools[0]}
		}
		for _, pool := range order {
			prompt := make([]string, 8)
			for k := range prompt {
				prompt[k] = words[rng.IntN(len(words))]
			}
			question := fmt.Sprintf("%s %s %d.%d: %s?", fault, pool, round, i, strings.Join(prompt, " "))
			msgs := []schemas.Message{{Role: schemas.MessageUser, Content: schemas.TextContent(question)}}
			want, err := fakellm.FullText(m, msgs, o.maxTokens)
			if err != nil {
				return nil, nil, err
			}
			id, err := fakellm.RequestID(msgs, o.maxTokens)
			if err != nil {
				return nil, nil, err
			}
			j := job{pool: pool, index: i, id: id, stream: i%2 == 0, want: want}
			req := map[string]any{"model": pool, "messages": msgs, "max_tokens": o.maxTokens}
			if j.stream {
				req["stream"], req["stream_options"] = true, map[string]bool{"include_usage": true}
			}
			if j.body, err = json.Marshal(req); err != nil {
				return nil, nil, err
			}
			if _, dup := ids[id]; dup {
				return nil, nil, fmt.Errorf("two requests of the run share request id %d", id)
			}
			ids[id] = j
			jobs = append(jobs, j)
		}
	}
	return jobs, ids, nil
}

// route is one simulated route.
type route struct {
	name string
	fake *fakellm.Server
	srv  *httptest.Server
}

// startRoutes starts the faulty route, which breaks every stream the way
// fault says after o.breakAfter tokens, and two healthy ones; all continue
// in continue_final_message style and report their records to onRecord.
func startRoutes(o options, fault fakellm.BreakMode, onRecord func(fakellm.Record)) ([]route, error) {
	m, err := routeModel()
	if err != nil {
		return nil, err
	}
	var routes []route
	for i, name := range []string{"faulty", "healthy-1", "healthy-2"} {
		opts := fakellm.Options{Model: m, Seed: o.seed, Route: i, TimeScale: o.timeScale,
			Continuation: fakellm.ContinuationFinalMessage}
		opts.OnRecord = onRecord
		if i == 0 {
			opts.BreakShare, opts.BreakAfter, opts.BreakMode = 1, o.breakAfter, fault
		}
		fake, err := fakellm.New(opts)
		if err != nil {
			return routes, fmt.Errorf("route %s: %w", name, err)
		}
		routes = append(routes, route{name: name, fake: fake, srv: httptest.NewServer(fake)})
	}
	return routes, nil
}

// startServe runs serve over the routes with the pools "rescued" (rescue:
// continue, max 1) and "plain" (rescue off), as internal/node's rescue
// tests do; outlier detection keeps its defaults.
func startServe(o options, routes []route) (*node.Serve, error) {
	var y strings.Builder
	y.WriteString("http:\n  listen: 127.0.0.1:0\nroutes:\n")
	var names []string
	for _, r := range routes {
		fmt.Fprintf(&y, "  - {name: %s, provider: openai, base_url: %q, model: m, continuation: %s}\n",
			r.name, r.srv.URL+"/v1", config.ContinuationContinueFinalMessage)
		names = append(names, r.name)
	}
	list := strings.Join(names, ", ")
	fmt.Fprintf(&y, `pools:
  %s: {routes: [%s], rescue: {mode: continue, max: 1}}
  %s: {routes: [%s]}
policies:
  default: {control_fraction: 0, deadline: 10s, heartbeat_interval: 50ms, stall_after_first_token: %s, stall_floor: %s}
tenants:
  acme: {api_key_hashes: [%q]}
`, poolRescued, list, poolPlain, list, o.stallBound, o.stallBound, config.HashAPIKey(apiKey))
	cfg, err := config.Parse("rescuerun.yaml", []byte(y.String()), config.RoleServe, func(string) (string, bool) { return "", false })
	if err != nil {
		return nil, fmt.Errorf("config: %w\n%s", err, y.String())
	}
	return node.StartServe(cfg, node.Options{})
}

// jobResult is what a job's tries came to.
type jobResult struct {
	job         job
	tries       int
	interrupted int
	why         string // why the last try's answer is not the whole answer; "" when it is
	// lastInterrupted says the last try ended stream_interrupted: the
	// rescued pool's only try, or the plain pool's maxTries-th.
	lastInterrupted bool
	elapsed         time.Duration
}

// send runs a job: one try, or for the plain pool's streams as many as
// today's client needs, each sent at once after a stream_interrupted.
func send(ctx context.Context, client *http.Client, base string, j job) jobResult {
	r := jobResult{job: j}
	start := time.Now()
	for {
		r.tries++
		interrupted, why := try(ctx, client, base, j)
		r.elapsed = time.Since(start)
		if !interrupted {
			r.why = why
			return r
		}
		r.interrupted++
		if j.pool != poolPlain || r.tries == maxTries {
			r.why, r.lastInterrupted = why, true
			return r
		}
	}
}

// try sends the job's request once and reads the whole answer: whether it
// ended stream_interrupted, and why it is not the whole answer.
func try(ctx context.Context, client *http.Client, base string, j job) (interrupted bool, why string) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(j.body))
	if err != nil {
		return false, err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := client.Do(req)
	if err != nil {
		return false, "request: " + err.Error()
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return false, "reading the answer: " + err.Error()
	}
	if !j.stream {
		return false, checkCompletion(resp.StatusCode, body, j.want)
	}
	if resp.StatusCode != http.StatusOK {
		return false, checkCompletion(resp.StatusCode, body, j.want)
	}
	a, err := joinStream(body)
	if err == nil && a.errSeen && a.errCode == string(schemas.ErrStreamInterrupted) {
		return true, checkStream(a, err, j.want)
	}
	return false, checkStream(a, err, j.want)
}

// readRescues reads hedgerow_rescues_total by outcome from the gateway's
// /metrics; an outcome never counted is 0.
func readRescues(ctx context.Context, client *http.Client, base string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics: status %d: %v", resp.StatusCode, err)
	}
	return rescueCounts(string(body))
}

// rescueCounts reads hedgerow_rescues_total{outcome} from a metrics page.
func rescueCounts(page string) (map[string]float64, error) {
	counts := map[string]float64{}
	for _, line := range strings.Split(page, "\n") {
		rest, ok := strings.CutPrefix(line, `hedgerow_rescues_total{outcome="`)
		if !ok {
			continue
		}
		outcome, value, ok := strings.Cut(rest, `"} `)
		if !ok {
			return nil, fmt.Errorf("metrics line %q", line)
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		counts[outcome] = v
	}
	return counts, nil
}
