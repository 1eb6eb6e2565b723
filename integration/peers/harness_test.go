package peers

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cristalhq/hedgedhttp"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/hedgepolicy"

	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/node"
	"github.com/hedgerow/hedgerow/internal/tools/loadgen"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// The contenders, in the order the table prints them.
const (
	contenderNone       = "none"
	contenderHedgedHTTP = "hedgedhttp"
	contenderFailsafe   = "failsafe-go"
	contenderHedgerow   = "hedgerow"
)

var contenderNames = []string{contenderNone, contenderHedgedHTTP, contenderFailsafe, contenderHedgerow}

// hedgerowAt is hedgerow's index among the contenders.
var hedgerowAt = slices.Index(contenderNames, contenderHedgerow)

// row is the report of the contender named name among cs (in
// contenderNames order).
func row(cs []contenderReport, name string) contenderReport {
	return cs[slices.Index(contenderNames, name)]
}

// The names the hedgerow configuration gives its parts.
const (
	poolName    = "general"
	classHedged = "hedged"
	routes      = 3
)

// modelDeadline is the pinned deadline of docs/architecture.md §11, in model
// time; every contender's client gives up on a request at its real
// equivalent, and a failed request counts at it.
const modelDeadline = 30 * time.Second

// options select one comparison.
type options struct {
	// PerContender is how many measured requests each contender sends.
	PerContender int
	// Warmup is how many unmeasured requests hedgerow sends first, to teach
	// its delay estimator the routes; none sends three times as many,
	// interleaved, so the warm-up loads the host as the measured run does
	// (three direct contenders to one hedgerow), and the P95 of its time to
	// first token over the warm-up's second half is the peers' delay.
	Warmup int
	// Rate is the Poisson arrival rate of all contenders together, per
	// real second (each contender's share is a thinned Poisson process at
	// Rate / 4).
	Rate float64
	// TimeScale is real seconds per model second.
	TimeScale float64
	// Delay, when set, pins the peers' delay (real time) instead of the
	// warm-up's P95: a noisy warm-up then cannot move it.
	Delay time.Duration
	// DelayFromHedgerow gives the peers hedgerow's own delay instead: the
	// median delay its groups armed over the warm-up's second half, its
	// estimate of the same P95. The two then hedge at one delay, and what
	// differs is what each does with it; otherwise the peers' P95, taken
	// from ~1,500 primary-only requests, lands ±10 ms from hedgerow's from
	// run to run, and whichever is lower buys a shorter tail with more
	// duplicates.
	DelayFromHedgerow bool
	// Oracle leaves the degraded route out of hedgerow's pool under uneven
	// routes, as if its route choice knew which route is degraded and sent
	// it nothing: the bound any route choice can reach there. The peers
	// keep all three routes.
	Oracle   bool
	Seed     uint64
	Workload string
	// Conditions are run one after the other, each on fresh fakes and a
	// fresh hedgerow.
	Conditions []condition
	// Log receives progress lines; nil discards them.
	Log func(format string, args ...any)
}

// condition is how the fake providers open their streams, whether the
// routes are equal, and the target hedgerow's ratios over the best peer
// are held to.
type condition struct {
	Name string
	// OpenEarly: headers and the opening chunk at once, the first token at
	// the drawn first byte (fakellm.Options.OpenEarly), as real providers
	// do. Without it the headers wait for the first token — the best case
	// for a hedger that races on response headers.
	OpenEarly bool
	// Uneven: fake route 0 is degraded (workload.UnevenShift: twice its
	// siblings' stall share, half their decode speed), and the direct
	// contenders send every primary to the first route of their order and
	// the k-th attempt to the k-th route, as a user of hedgedhttp or
	// failsafe-go configures a primary and its fallbacks. Equal routes
	// keep today's round-robin primaries (the order then changes nothing).
	Uneven bool
	// DegradedLast puts the degraded route last in the contenders' route
	// order (and hedgerow's configuration) instead of first: the peers'
	// primary and hedge then both go to healthy routes.
	DegradedLast bool
	// TargetP99 and TargetP999 bound hedgerow's TTFT ratios over the best
	// peer (docs/architecture.md §11; issue 27 for the uneven routes).
	TargetP99, TargetP999 float64
}

var (
	conditionHeadersAtFirstToken = condition{Name: "headers at first token", TargetP99: 1, TargetP999: 1}
	conditionOpenEarly           = condition{Name: "open early (headers at once, stall before first token)", OpenEarly: true, TargetP99: 1, TargetP999: 1}
	// The uneven conditions send headers with the first token, the peers'
	// best case: what hedgerow gains there it gains by where it sends its
	// attempts, not by a header race the peers lose.
	conditionUnevenFirst = condition{Name: "uneven routes, degraded route first (the peers' primary)",
		Uneven: true, TargetP99: 0.85, TargetP999: 0.70}
	conditionUnevenLast = condition{Name: "uneven routes, degraded route last",
		Uneven: true, DegradedLast: true, TargetP99: 0.95, TargetP999: 0.95}
)

// degradedRoute is the fake route the uneven conditions degrade.
const degradedRoute = 0

// order is the fake routes in the contenders' route order: the first is
// the direct contenders' primary under uneven routes.
func (c condition) order() []int {
	if c.DegradedLast {
		return []int{1, 2, degradedRoute}
	}
	return []int{degradedRoute, 1, 2}
}

// model is the workload the fakes play under c.
func (c condition) model(name string) (*workload.Model, error) {
	m, err := workload.ByName(name)
	if err != nil {
		return nil, err
	}
	if c.Uneven {
		m.Shift = workload.UnevenShift()
		m.Shift.Route = degradedRoute
	}
	return m, nil
}

func (o options) deadline() time.Duration { return scaled(modelDeadline, o.TimeScale) }

func scaled(d time.Duration, scale float64) time.Duration {
	return time.Duration(float64(d) * scale)
}

// conditionReport is one condition's outcome.
type conditionReport struct {
	Condition condition
	// Delay is the peers' fixed hedge delay: the P95 of the primary-only
	// client-measured time to first token over the warm-up's second half,
	// or options.Delay.
	Delay time.Duration
	// DelaySource says where Delay came from.
	DelaySource string
	// RunDelay is the same P95 taken over none's requests of the measured
	// run: how well the warm-up's figure stood for the run.
	RunDelay time.Duration
	// ModelDelay is the workload model's own P95 first byte, scaled to
	// real time: what Delay would be on an idle host. Delay far above it
	// says the host, not the model, set the run's latencies.
	ModelDelay time.Duration
	// Contenders are in contenderNames order.
	Contenders []contenderReport
	// UpstreamRequests is what the fakes' own /stats counted over the
	// measured run; the contenders' Upstream counts must add up to it.
	UpstreamRequests int64
	Elapsed          time.Duration
	// Tails take each contender's slowest requests apart (tail_test.go).
	Tails []tailReport
	// HedgedArm is hedgerow's row over the groups its guardrail let hedge:
	// without the control arm, the share of groups (1% by default) kept
	// primary-only on purpose as the baseline hedging is judged against
	// (docs/architecture.md §5), which the peers do not keep.
	HedgedArm contenderReport
	// Hedgerow is what hedgerow's own /metrics said over the measured run:
	// context for its row, never the source of its duplicate rate.
	Hedgerow hedgerowMetrics
}

// hedgerowMetrics are counters of hedgerow's /metrics over one run.
type hedgerowMetrics struct {
	// Attempts counts attempts launched, by role.
	Attempts       map[string]float64
	HedgesLaunched float64
	// Suppressed counts hedges and replacements not launched, by reason.
	Suppressed map[string]float64
	// MeanDelay is the mean hedge delay armed.
	MeanDelay time.Duration
	// CommitWait is the bucket bound under which half and 99% of the
	// waits for a committed group's record fell: time on every stream's
	// path to its first bytes (docs/architecture.md §9).
	CommitWait [2]time.Duration
	// Warnings counts the live system's (fakes' included) log records at
	// Warn and above over the run, by message and code.
	Warnings map[string]int
}

// contenderReport is one contender's measured figures; times are real.
type contenderReport struct {
	Name     string
	Requests int
	// Errors counts requests that did not end in a complete stream; they
	// count at the deadline in both latency distributions.
	Errors int
	// Upstream counts the chat requests the fakes received for this
	// contender's requests; Extra is Upstream minus one per request that
	// reached a fake at all. MaxPerRequest is the most any one request
	// caused.
	Upstream, Extra, MaxPerRequest int
	// Unreached counts requests no fake ever saw.
	Unreached int
	// ErrorKinds counts Errors by kind (errorKind).
	ErrorKinds map[string]int
	// Primaries and Extras count, by fake route, each request's first
	// upstream request and the ones after it: where the contender sent
	// its primaries and its duplicates.
	Primaries, Extras [routes]int
	TTFT, End         distribution
	// ttfts and ends are the samples TTFT and End summarize, kept so runs
	// of several seeds can be pooled (pool.go).
	ttfts, ends []time.Duration
}

// DuplicateRate is extra upstream requests per caller request.
func (c contenderReport) DuplicateRate() float64 {
	if c.Requests == 0 {
		return 0
	}
	return float64(c.Extra) / float64(c.Requests)
}

// distribution is a latency distribution's summary, real time.
type distribution struct {
	P50, P90, P99, P999, Max time.Duration
}

func summarize(samples []time.Duration) distribution {
	s := slices.Clone(samples)
	slices.Sort(s)
	return distribution{P50: quantile(s, 0.50), P90: quantile(s, 0.90), P99: quantile(s, 0.99), P999: quantile(s, 0.999), Max: quantile(s, 1)}
}

// quantiles sorts xs and reads the qs quantiles of it.
func quantiles(xs []time.Duration, qs ...float64) []time.Duration {
	slices.Sort(xs)
	out := make([]time.Duration, len(qs))
	for i, q := range qs {
		out[i] = quantile(xs, q)
	}
	return out
}

// quantile is the nearest-rank quantile of sorted values, as `hedgerow
// simulate` takes it.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// compare runs every condition of o.
func compare(ctx context.Context, o options) ([]*conditionReport, error) {
	var out []*conditionReport
	for _, c := range o.Conditions {
		rep, err := runCondition(ctx, o, c)
		if err != nil {
			return out, fmt.Errorf("condition %q: %w", c.Name, err)
		}
		out = append(out, rep)
	}
	return out, nil
}

// warnCounter is the live system's logger: it counts records at Warn and
// above by message and their code or reason attributes (hedgerow's logs
// carry no prompts or outputs), so the report can say why requests failed.
type warnCounter struct {
	mu     *sync.Mutex
	counts map[string]int
	attrs  []slog.Attr
}

func newWarnCounter() *warnCounter {
	return &warnCounter{mu: &sync.Mutex{}, counts: map[string]int{}}
}

func (w *warnCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (w *warnCounter) Handle(_ context.Context, r slog.Record) error {
	key := r.Message
	add := func(a slog.Attr) bool {
		if k := strings.ToLower(a.Key); strings.Contains(k, "code") || strings.Contains(k, "reason") {
			key += " " + a.Key + "=" + a.Value.String()
		}
		return true
	}
	for _, a := range w.attrs {
		add(a)
	}
	r.Attrs(add)
	w.mu.Lock()
	w.counts[key]++
	w.mu.Unlock()
	return nil
}

func (w *warnCounter) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &warnCounter{mu: w.mu, counts: w.counts, attrs: append(slices.Clone(w.attrs), attrs...)}
}

func (w *warnCounter) WithGroup(string) slog.Handler { return w }

// take returns and forgets the counts.
func (w *warnCounter) take() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := maps.Clone(w.counts)
	clear(w.counts)
	return out
}

// stage is a live system for one condition: three fakes, hedgerow's serve
// in front of them, and the counter of what reached the fakes.
type stage struct {
	o        options
	c        condition
	fakes    []*node.FakeLLM
	serve    *node.Serve
	upstream *upstreamCounter
	warns    *warnCounter
	groups   *groupTap
	hosts    []string // host:port of each fake route, by fake route index
	// ordered is hosts in the condition's route order, as the direct
	// contenders and hedgerow's configuration list them.
	ordered []string
}

// fingerprintKey keys hedgerow's prompt fingerprints, so the harness can
// find each of its requests' group record (tail_test.go).
var fingerprintKey = []byte("peers comparison fingerprint key")

func startStage(o options, c condition) (*stage, error) {
	s := &stage{o: o, c: c, upstream: newUpstreamCounter(), warns: newWarnCounter()}
	log := slog.New(s.warns)
	model, err := c.model(o.Workload)
	if err != nil {
		return nil, err
	}
	for r := range routes {
		f, err := node.StartFakeLLM("127.0.0.1:0", fakellm.Options{
			Model: model, Seed: o.Seed, TimeScale: o.TimeScale, Route: r, OpenEarly: c.OpenEarly,
			OnStart: s.upstream.start, OnRecord: s.upstream.record,
		}, log)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("start fake route %d: %w", r, err), s.stop(context.Background()))
		}
		s.fakes = append(s.fakes, f)
		s.hosts = append(s.hosts, f.Addr().String())
	}
	for _, r := range c.order() {
		s.ordered = append(s.ordered, s.hosts[r])
	}
	cfg, err := config.Parse("peers.yaml", []byte(configYAML(o, s.hosts, o.hedgerowOrder(c))), config.RoleServe, func(string) (string, bool) { return "", false })
	if err != nil {
		return nil, errors.Join(fmt.Errorf("hedgerow configuration: %w", err), s.stop(context.Background()))
	}
	s.serve, err = node.StartServe(cfg, node.Options{Logger: log, FingerprintKey: fingerprintKey})
	if err != nil {
		return nil, errors.Join(err, s.stop(context.Background()))
	}
	if s.groups, err = tapGroupRecords(s.serve); err != nil {
		return nil, errors.Join(err, s.stop(context.Background()))
	}
	return s, nil
}

// hedgerowOrder is the route order of hedgerow's pool under c: the
// condition's, less the degraded route under uneven routes with Oracle.
func (o options) hedgerowOrder(c condition) []int {
	order := c.order()
	if o.Oracle && c.Uneven {
		order = slices.DeleteFunc(order, func(r int) bool { return r == degradedRoute })
	}
	return order
}

// configYAML is hedgerow's configuration: the fakes of order (the
// condition's route order, less the degraded route with Options.Oracle) as
// one pool, in that order, and one operation class on the default
// policy — hedging on, max_attempts 2, the adaptive delay at q = 0.95, the
// default duplicate budget and guardrail — with the durations the workload
// model decides scaled as `hedgerow demo` scales them (deadline, minimum
// useful time, delay clamps). Route fake-r is fake route r whatever the
// order.
func configYAML(o options, hosts []string, order []int) string {
	scale := func(d time.Duration) time.Duration { return scaled(d, o.TimeScale) }
	var b strings.Builder
	fmt.Fprintf(&b, "http:\n  listen: 127.0.0.1:0\n")
	fmt.Fprintf(&b, "routes:\n")
	names := make([]string, len(order))
	for i, r := range order {
		names[i] = fmt.Sprintf("fake-%d", r)
		fmt.Fprintf(&b, "  - name: %s\n    provider: openai\n    base_url: http://%s/v1\n    model: %s\n", names[i], hosts[r], o.Workload)
	}
	fmt.Fprintf(&b, "pools:\n  %s:\n    routes: [%s]\n", poolName, strings.Join(names, ", "))
	fmt.Fprintf(&b, "policies:\n  %s:\n    hedge: true\n    deadline: %v\n    min_useful_time: %v\n", classHedged, scale(modelDeadline), scale(500*time.Millisecond))
	fmt.Fprintf(&b, "    delay: {min: %v, initial: %v, max: %v}\n", scale(100*time.Millisecond), scale(time.Second), scale(10*time.Second))
	return b.String()
}

func (s *stage) stop(ctx context.Context) error {
	var errs []error
	if s.groups != nil {
		s.groups.close()
	}
	if s.serve != nil {
		if err := s.serve.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop serve: %w", err))
		}
	}
	for i, f := range s.fakes {
		if err := f.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop fake route %d: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

// totalRequests is the sum of the fakes' own /stats request counts.
func (s *stage) totalRequests(ctx context.Context, client *http.Client) (int64, error) {
	var sum int64
	for r, h := range s.hosts {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+h+"/stats?limit=1", nil)
		if err != nil {
			return 0, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, fmt.Errorf("fake route %d stats: %w", r, err)
		}
		var st fakellm.Stats
		err = json.NewDecoder(resp.Body).Decode(&st)
		_ = resp.Body.Close()
		if err != nil {
			return 0, fmt.Errorf("fake route %d stats: %w", r, err)
		}
		sum += st.Totals.Requests
	}
	return sum, nil
}

// upstreamCounter counts, from the fakes' own callbacks, the chat requests
// that reached them, by request id: what a contender cost the providers,
// whatever the contender says about itself.
type upstreamCounter struct {
	started, finished atomic.Int64
	mu                sync.Mutex
	byRequest         map[uint64][]fakellm.Record
}

func newUpstreamCounter() *upstreamCounter {
	return &upstreamCounter{byRequest: make(map[uint64][]fakellm.Record)}
}

func (u *upstreamCounter) start() { u.started.Add(1) }

func (u *upstreamCounter) record(r fakellm.Record) {
	u.mu.Lock()
	u.byRequest[r.RequestID] = append(u.byRequest[r.RequestID], r)
	u.mu.Unlock()
	u.finished.Add(1)
}

// quiet waits, for at most timeout, until every request that reached a
// fake has finished there, so every loser is counted.
func (u *upstreamCounter) quiet(ctx context.Context, timeout time.Duration) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	limit := time.NewTimer(timeout)
	defer limit.Stop()
	for u.started.Load() != u.finished.Load() {
		select {
		case <-tick.C:
		case <-limit.C:
			return fmt.Errorf("fakes still hold %d requests %v after the run", u.started.Load()-u.finished.Load(), timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// take returns and forgets the records by request id.
func (u *upstreamCounter) take() map[uint64][]fakellm.Record {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := u.byRequest
	u.byRequest = make(map[uint64][]fakellm.Record)
	return out
}

// drainTimeout bounds the wait, after a run's last response, for the fakes
// to let go of the run's last losers (the cancel lag and hedgerow's cancel
// grace are well inside it).
const drainTimeout = 15 * time.Second

// request is one request of a run: its body, its fake request id, its
// prompt fingerprint (what hedgerow's records name it by) and the
// contender that sends it.
type request struct {
	body        []byte
	id          uint64
	fingerprint string
	contender   int
}

// makeRequests builds n streaming chat requests whose texts say which run
// and which request they are, so every request id is distinct.
func makeRequests(run string, n int, contenders []int) ([]request, error) {
	out := make([]request, n)
	for i := range out {
		chat := schemas.ChatRequest{
			Model:    poolName,
			Messages: []schemas.Message{{Role: schemas.MessageUser, Content: schemas.TextContent(fmt.Sprintf("%s request %d of the peers comparison.", run, i))}},
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
		fp, err := chat.Fingerprint(fingerprintKey)
		if err != nil {
			return nil, fmt.Errorf("fingerprint request %d: %w", i, err)
		}
		out[i] = request{body: body, id: id, fingerprint: fp, contender: contenders[i]}
	}
	return out, nil
}

// interleave assigns each of perContender × len(contenders) arrivals to a
// contender by a seeded shuffle: every contender gets exactly perContender
// requests, spread over the whole run, so a noisy host slows them alike.
func interleave(contenders []int, perContender int, seed uint64) []int {
	out := make([]int, 0, perContender*len(contenders))
	for range perContender {
		out = append(out, contenders...)
	}
	r := rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d))
	r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// runLoad sends reqs open-loop through the contenders' targets and returns
// what the client measured and the fakes' records of what reached them, by
// request.
func (s *stage) runLoad(ctx context.Context, seed uint64, reqs []request, targets []loadgen.Target) (*loadgen.Summary, [][]fakellm.Record, error) {
	lreqs := make([]loadgen.Request, len(reqs))
	index := make(map[uint64]int, len(reqs))
	for i, r := range reqs {
		lreqs[i] = loadgen.Request{Body: r.body, Target: r.contender, Header: http.Header{}}
		index[r.id] = i
	}
	sum, err := loadgen.Run(ctx, loadgen.Options{
		Targets: targets, Requests: lreqs, Rate: s.o.Rate, Seed: seed,
		Timeout: s.o.deadline(),
	})
	if err != nil {
		return nil, nil, err
	}
	if err := s.upstream.quiet(ctx, drainTimeout); err != nil {
		return nil, nil, err
	}
	upstream := make([][]fakellm.Record, len(reqs))
	for id, recs := range s.upstream.take() {
		i, ok := index[id]
		if !ok {
			return nil, nil, fmt.Errorf("%d fake requests with id %x match no request of the run: "+
				"the harness's request ids no longer follow the fake LLM's derivation", len(recs), id)
		}
		upstream[i] = recs
	}
	return sum, upstream, nil
}

func runCondition(ctx context.Context, o options, c condition) (rep *conditionReport, err error) {
	logf := o.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	s, err := startStage(o, c)
	if err != nil {
		return nil, err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		err = errors.Join(err, s.stop(stopCtx))
	}()
	statsClient := &http.Client{Timeout: 10 * time.Second}
	defer statsClient.CloseIdleConnections()

	rotate := !c.Uneven
	none := newDirectTarget(s.ordered, rotate)
	defer none.close()
	hr, err := newHedgerowTarget("http://" + s.serve.HTTPAddr().String())
	if err != nil {
		return nil, err
	}
	defer hr.close()

	// Warm-up: none and hedgerow interleaved, unmeasured.
	const warmNone, warmHedgerow = 0, 1
	warm, err := makeRequests("Warm-up "+c.Name, 4*o.Warmup, interleave([]int{warmNone, warmNone, warmNone, warmHedgerow}, o.Warmup, o.Seed+1))
	if err != nil {
		return nil, err
	}
	logf("%s: warm-up, %d requests", c.Name, len(warm))
	wsum, _, err := s.runLoad(ctx, o.Seed+1, warm, []loadgen.Target{none, hr})
	if err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	// The delay is taken over the warm-up's second half: its first
	// seconds run on a cold process (connections, heap, hedgerow's
	// estimator at its initial delay).
	var ttfts []time.Duration
	for i, res := range wsum.Results {
		if warm[i].contender == warmNone && i >= len(warm)/2 && res.Err == nil && res.FirstToken > 0 {
			ttfts = append(ttfts, res.FirstToken)
		}
	}
	if len(ttfts) < max(o.Warmup/2, 1) {
		return nil, fmt.Errorf("warm-up: only %d of the second half's ~%d primary-only requests answered", len(ttfts), 3*o.Warmup/2)
	}
	slices.Sort(ttfts)
	delay, source := quantile(ttfts, 0.95), "P95 of primary-only time to first token over the warm-up's second half"
	switch {
	case o.Delay > 0:
		delay, source = o.Delay, "pinned by -peers.delay"
	case o.DelayFromHedgerow:
		if delay, err = s.hedgerowDelay(ctx, warm[len(warm)/2:], warmHedgerow); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
		source = "hedgerow's own: the median delay its groups armed over the warm-up's second half"
	}

	hh, err := newHedgedHTTPTarget(s.ordered, rotate, delay)
	if err != nil {
		return nil, err
	}
	defer hh.close()
	fs := newFailsafeTarget(s.ordered, rotate, delay)
	defer fs.close()
	targets := []loadgen.Target{none, hh, fs, hr} // contenderNames order

	all := make([]int, len(contenderNames))
	for i := range all {
		all[i] = i
	}
	reqs, err := makeRequests(c.Name, o.PerContender*len(all), interleave(all, o.PerContender, o.Seed))
	if err != nil {
		return nil, err
	}
	before, err := s.totalRequests(ctx, statsClient)
	if err != nil {
		return nil, err
	}
	metricsBefore, err := s.metrics(ctx, statsClient)
	if err != nil {
		return nil, err
	}
	s.warns.take() // the warm-up's
	s.groups.reset()
	logf("%s: peers' delay %v, %s (the warm-up's P95 over %d primary-only first tokens: %v); measured run, %d requests at %v/s",
		c.Name, delay, source, len(ttfts), quantile(ttfts, 0.95), len(reqs), o.Rate)
	sum, upstream, err := s.runLoad(ctx, o.Seed, reqs, targets)
	if err != nil {
		return nil, fmt.Errorf("measured run: %w", err)
	}
	after, err := s.totalRequests(ctx, statsClient)
	if err != nil {
		return nil, err
	}
	metricsAfter, err := s.metrics(ctx, statsClient)
	if err != nil {
		return nil, err
	}
	modelDelay, err := modelFirstByteP95(o, c)
	if err != nil {
		return nil, err
	}
	rep = &conditionReport{Condition: c, Delay: delay, DelaySource: source, ModelDelay: modelDelay, UpstreamRequests: after - before, Elapsed: sum.Elapsed}
	rep.Contenders = measure(reqs, sum, upstream, o.deadline())
	rep.Hedgerow = hedgerowDelta(metricsBefore, metricsAfter)
	groups, _, err := s.groups.wait(ctx, fingerprintsOf(reqs, hedgerowAt), drainTimeout)
	if err != nil {
		return nil, err
	}
	rep.Tails = tails(reqs, traces(reqs, sum, upstream, groups, o.deadline()), o.TimeScale)
	rep.HedgedArm = hedgedArm(reqs, sum, upstream, groups, o.deadline())
	rep.Hedgerow.Warnings = s.warns.take()
	var noneTTFT []time.Duration
	for i, res := range sum.Results {
		if reqs[i].contender == 0 && res.Err == nil && res.FirstToken > 0 {
			noneTTFT = append(noneTTFT, res.FirstToken)
		}
	}
	slices.Sort(noneTTFT)
	rep.RunDelay = quantile(noneTTFT, 0.95)
	return rep, nil
}

// fingerprintsOf are the prompt fingerprints of contender's requests among
// reqs, by which hedgerow's group records name them.
func fingerprintsOf(reqs []request, contender int) []string {
	var out []string
	for _, r := range reqs {
		if r.contender == contender {
			out = append(out, r.fingerprint)
		}
	}
	return out
}

// hedgerowDelay is the median hedge delay hedgerow's groups among reqs
// (those of contender hedgerow) armed, from their group records.
func (s *stage) hedgerowDelay(ctx context.Context, reqs []request, hedgerow int) (time.Duration, error) {
	want := fingerprintsOf(reqs, hedgerow)
	groups, _, err := s.groups.wait(ctx, want, drainTimeout)
	if err != nil {
		return 0, err
	}
	var delays []time.Duration
	for _, g := range groups {
		if g.HedgeDelayMs != nil {
			delays = append(delays, time.Duration(*g.HedgeDelayMs)*time.Millisecond)
		}
	}
	if len(delays) == 0 {
		return 0, fmt.Errorf("none of hedgerow's %d warm-up groups armed a hedge delay", len(want))
	}
	return quantiles(delays, 0.5)[0], nil
}

// metrics reads hedgerow's /metrics as sample name (with its labels) →
// value.
func (s *stage) metrics(ctx context.Context, client *http.Client) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.serve.HTTPAddr().String()+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("hedgerow metrics: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("hedgerow metrics: HTTP %d", resp.StatusCode)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("hedgerow metrics: %w", err)
	}
	return out, nil
}

func hedgerowDelta(before, after map[string]float64) hedgerowMetrics {
	d := func(name string) float64 { return after[name] - before[name] }
	m := hedgerowMetrics{HedgesLaunched: d("hedgerow_hedges_launched_total"), Suppressed: map[string]float64{}, Attempts: map[string]float64{}}
	by := func(into map[string]float64, prefix string) {
		for name := range after {
			if label, ok := strings.CutPrefix(name, prefix); ok {
				if n := d(name); n > 0 {
					into[strings.TrimSuffix(label, `"}`)] = n
				}
			}
		}
	}
	by(m.Suppressed, `hedgerow_hedges_suppressed_total{reason="`)
	by(m.Attempts, `hedgerow_attempts_total{role="`)
	m.CommitWait = [2]time.Duration{histogramBound(before, after, "hedgerow_records_commit_publish_seconds", 0.5),
		histogramBound(before, after, "hedgerow_records_commit_publish_seconds", 0.99)}
	if n := d("hedgerow_hedge_delay_seconds_count"); n > 0 {
		m.MeanDelay = time.Duration(d("hedgerow_hedge_delay_seconds_sum") / n * float64(time.Second))
	}
	return m
}

// histogramBound is the upper bound of the first bucket of histogram name
// that holds the q share of its observations between two scrapes.
func histogramBound(before, after map[string]float64, name string, q float64) time.Duration {
	type bucket struct{ le, n float64 }
	var buckets []bucket
	for k, v := range after {
		le, ok := strings.CutPrefix(k, name+`_bucket{le="`)
		if !ok {
			continue
		}
		bound, err := strconv.ParseFloat(strings.TrimSuffix(le, `"}`), 64)
		if err != nil {
			continue
		}
		buckets = append(buckets, bucket{bound, v - before[k]})
	}
	slices.SortFunc(buckets, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	if len(buckets) == 0 || buckets[len(buckets)-1].n == 0 {
		return 0
	}
	total := buckets[len(buckets)-1].n
	for _, b := range buckets {
		if b.n >= q*total {
			return time.Duration(b.le * float64(time.Second))
		}
	}
	return 0
}

// modelFirstByteP95 is the P95 of the first byte of the workload's
// successful attempts on the first route of c's order (20,000 draws), in
// real time.
func modelFirstByteP95(o options, c condition) (time.Duration, error) {
	m, err := c.model(o.Workload)
	if err != nil {
		return 0, err
	}
	g, err := workload.NewGenerator(m, o.Seed)
	if err != nil {
		return 0, err
	}
	p, err := g.Provider(c.order()[0], workload.RateLimit{})
	if err != nil {
		return 0, err
	}
	var firsts []time.Duration
	for id := range uint64(20_000) {
		a, err := p.Attempt(g.Request(id), 1, 0)
		if err != nil {
			return 0, err
		}
		if a.Outcome == workload.OutcomeOK {
			firsts = append(firsts, a.FirstByte)
		}
	}
	slices.Sort(firsts)
	return scaled(quantile(firsts, 0.95), o.TimeScale), nil
}

// measure turns a run's results into one report per contender.
func measure(reqs []request, sum *loadgen.Summary, upstream [][]fakellm.Record, deadline time.Duration) []contenderReport {
	out := make([]contenderReport, len(contenderNames))
	ttft := make([][]time.Duration, len(contenderNames))
	end := make([][]time.Duration, len(contenderNames))
	for i, res := range sum.Results {
		k := reqs[i].contender
		c := &out[k]
		n := len(upstream[i])
		c.Requests++
		c.Upstream += n
		c.Extra += max(n-1, 0)
		c.MaxPerRequest = max(c.MaxPerRequest, n)
		if n == 0 {
			c.Unreached++
		}
		if n > 0 {
			first := slices.MinFunc(upstream[i], func(a, b fakellm.Record) int { return cmp.Compare(a.StartUnixMs, b.StartUnixMs) })
			c.Primaries[first.Route]++
			for _, r := range upstream[i] {
				c.Extras[r.Route]++
			}
			c.Extras[first.Route]--
		}
		if res.Err != nil || res.FirstToken <= 0 {
			c.Errors++
			if c.ErrorKinds == nil {
				c.ErrorKinds = map[string]int{}
			}
			c.ErrorKinds[errorKind(res.Err)]++
			ttft[k] = append(ttft[k], deadline)
			end[k] = append(end[k], deadline)
			continue
		}
		ttft[k] = append(ttft[k], res.FirstToken)
		end[k] = append(end[k], res.Total)
	}
	for k := range out {
		out[k].Name = contenderNames[k]
		out[k].ttfts, out[k].ends = ttft[k], end[k]
		out[k].TTFT, out[k].End = summarize(ttft[k]), summarize(end[k])
	}
	return out
}

// hedgedArm is measure's hedgerow row over its requests whose group record
// does not put them in the guardrail's control arm.
func hedgedArm(reqs []request, sum *loadgen.Summary, upstream [][]fakellm.Record, groups map[string]schemas.GroupRecord, deadline time.Duration) contenderReport {
	arm := &loadgen.Summary{Start: sum.Start, Elapsed: sum.Elapsed}
	var armReqs []request
	var armUpstream [][]fakellm.Record
	for i, r := range reqs {
		if g, ok := groups[r.fingerprint]; r.contender != hedgerowAt || ok && g.GuardrailDecision == schemas.GuardrailControl {
			continue
		}
		armReqs = append(armReqs, r)
		arm.Results = append(arm.Results, sum.Results[i])
		armUpstream = append(armUpstream, upstream[i])
	}
	c := measure(armReqs, arm, armUpstream, deadline)[hedgerowAt]
	c.Name = contenderHedgerow + ", hedged arm"
	return c
}

// errorKind names the kind of a failed request's error for the table: the
// OpenAI error code of an answer or of an error event, the upstream status
// a peer gave up on, or the client's deadline.
func errorKind(err error) string {
	var (
		status *loadgen.StatusError
		stream *loadgen.StreamError
		up     errStatus
	)
	switch {
	case err == nil:
		return "no first token"
	case errors.As(err, &status):
		return fmt.Sprintf("HTTP %d %s", status.Status, status.Code)
	case errors.As(err, &stream):
		return "stream error " + stream.Code
	case errors.As(err, &up):
		return fmt.Sprintf("upstream HTTP %d", up.status)
	case errors.Is(err, context.DeadlineExceeded):
		return "client deadline"
	case errors.Is(err, loadgen.ErrIncomplete):
		return "incomplete stream"
	}
	return "other"
}

// requestState is carried in an attempt's context from the contender's
// Target to routeTransport: the request's primary route and how many
// attempts it has sent.
type requestState struct {
	primary  int
	attempts atomic.Int64
}

type requestStateKey struct{}

// routedTarget gives each request a primary route — round-robin over the
// fakes when rotate is set, else always the first of its order — before
// handing it to an HTTP target whose transport routes each attempt.
type routedTarget struct {
	inner  loadgen.Target
	rotate bool
	next   atomic.Uint64
	client *http.Client
}

func (t *routedTarget) Send(ctx context.Context, rq loadgen.Request, since func() time.Duration, res *loadgen.Result) {
	st := &requestState{}
	if t.rotate {
		st.primary = int((t.next.Add(1) - 1) % routes)
	}
	t.inner.Send(context.WithValue(ctx, requestStateKey{}, st), rq, since, res)
}

func (t *routedTarget) close() { t.client.CloseIdleConnections() }

func newRoutedTarget(client *http.Client, rotate bool) *routedTarget {
	// The host is replaced by routeTransport for every attempt.
	inner, err := loadgen.NewHTTPTarget("http://fake.invalid", "", "", client)
	if err != nil {
		panic(err) // a constant URL
	}
	return &routedTarget{inner: inner, rotate: rotate, client: client}
}

// routeTransport sends the k-th attempt of a request to route primary + k,
// so a hedge always goes to another fake than the attempt it races. With
// statusIsError, a non-200 answer is returned as an error, so the hedging
// library keeps racing (hedgedhttp launches its next attempt at once,
// failsafe-go's hedge keeps waiting for a good result) instead of handing
// a 5xx to the caller: what a user would configure.
type routeTransport struct {
	hosts         []string
	inner         *http.Transport
	statusIsError bool
}

// errStatus is an upstream answer other than 200, as routeTransport
// reports it to a hedging library.
type errStatus struct{ status int }

func (e errStatus) Error() string { return fmt.Sprintf("upstream answered HTTP %d", e.status) }

func (t *routeTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	st, ok := req.Context().Value(requestStateKey{}).(*requestState)
	if !ok {
		return nil, errors.New("peers: request without its routing state")
	}
	k := int(st.attempts.Add(1) - 1)
	out := req.Clone(req.Context())
	out.URL.Host = t.hosts[(st.primary+k)%len(t.hosts)]
	out.Host = ""
	if req.GetBody != nil {
		body, err := req.GetBody()
		if err != nil {
			return nil, fmt.Errorf("peers: request body: %w", err)
		}
		out.Body = body
	}
	resp, err := t.inner.RoundTrip(out)
	if err != nil || !t.statusIsError || resp.StatusCode == http.StatusOK {
		return resp, err
	}
	_ = resp.Body.Close()
	return nil, errStatus{resp.StatusCode}
}

// newTransport is a transport like loadgen.NewClient's: many idle
// connections kept, no compression.
func newTransport() *http.Transport {
	return loadgen.NewClient(loadgen.DefaultMaxInFlight).Transport.(*http.Transport)
}

// newDirectTarget is the none contender: one attempt to the request's
// primary route, no hedge, no retry.
func newDirectTarget(hosts []string, rotate bool) *routedTarget {
	return newRoutedTarget(&http.Client{Transport: &routeTransport{hosts: hosts, inner: newTransport()}}, rotate)
}

// newHedgedHTTPTarget is hedgedhttp's client: up to max_attempts (2)
// attempts, the next one delay after the last, the first response (headers)
// wins and the others are cancelled.
func newHedgedHTTPTarget(hosts []string, rotate bool, delay time.Duration) (*routedTarget, error) {
	rt := &routeTransport{hosts: hosts, inner: newTransport(), statusIsError: true}
	hc, err := hedgedhttp.New(hedgedhttp.Config{Transport: rt, Upto: maxAttempts, Delay: delay})
	if err != nil {
		return nil, fmt.Errorf("hedgedhttp: %w", err)
	}
	return newRoutedTarget(&http.Client{Transport: hc}, rotate), nil
}

// newFailsafeTarget is failsafe-go's hedge policy on its HTTP round
// tripper: max_attempts − 1 hedges at a fixed delay; only a 200 answer
// cancels the outstanding attempts.
func newFailsafeTarget(hosts []string, rotate bool, delay time.Duration) *routedTarget {
	rt := &routeTransport{hosts: hosts, inner: newTransport(), statusIsError: true}
	policy := hedgepolicy.NewBuilderWithDelay[*http.Response](delay).
		WithMaxHedges(maxAttempts - 1).
		CancelIf(func(r *http.Response, err error) bool { return err == nil && r != nil && r.StatusCode == http.StatusOK }).
		Build()
	return newRoutedTarget(&http.Client{Transport: failsafehttp.NewRoundTripper(rt, policy)}, rotate)
}

// maxAttempts is hedgerow's default max_attempts (dispatcher/hedge
// DefaultOptions), which the peers get as their bound too.
const maxAttempts = 2

// hedgerowTarget is hedgerow's OpenAI-compatible front door, the request
// sent under the hedged operation class.
type hedgerowTarget struct {
	inner  loadgen.Target
	client *http.Client
}

func newHedgerowTarget(baseURL string) (*hedgerowTarget, error) {
	client := loadgen.NewClient(loadgen.DefaultMaxInFlight)
	inner, err := loadgen.NewHTTPTarget(baseURL, "", "", client)
	if err != nil {
		return nil, err
	}
	return &hedgerowTarget{inner: inner, client: client}, nil
}

func (t *hedgerowTarget) Send(ctx context.Context, rq loadgen.Request, since func() time.Duration, res *loadgen.Result) {
	h := rq.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	h.Set(frontdoor.HeaderOperation, classHedged)
	rq.Header = h
	t.inner.Send(ctx, rq, since, res)
}

func (t *hedgerowTarget) close() { t.client.CloseIdleConnections() }
