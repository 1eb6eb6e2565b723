// Package route picks the route an attempt goes to (docs/architecture.md §5): the primary
// by power-of-two-choices over healthy routes, a hedge on a different route,
// preferring another provider or region. It is pure: the caller passes the
// time and the random source, so the live dispatcher and the simulator make
// the same choices from the same inputs.
package route

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// Label keys the hedge choice compares to spread duplicates across failure
// domains.
const (
	LabelProvider = "provider"
	LabelRegion   = "region"
)

// DefaultHalfLife is the latency EWMA's half-life when Options.HalfLife is
// zero: a sample's weight halves every 10 s, so a route that degrades (the
// simulator's degraded episodes last minutes) is seen within seconds while
// single outliers are smoothed.
const DefaultHalfLife = 10 * time.Second

// DefaultStallHalfLife is the stall share's half-life when
// Options.StallHalfLife is zero. A stall share compares rare events — 5 %
// of primaries against 7 % — so it needs more samples than a latency mean:
// at 10 s a route drawing 15 primaries a second weighs ~200 of them, too
// few to tell the two apart; at 30 s ~650, and a route that degrades still
// loses its primaries within a minute (docs/architecture.md §5, "Route
// choice").
const DefaultStallHalfLife = 30 * time.Second

// staleHalfLives is how many half-lives without a sample make a route's
// latency estimate count as missing: after 8 its newest sample weighs under
// 1/256 and says more about the past than about the route now.
const staleHalfLives = 8

var (
	// ErrUnknownRoute is returned for a route name the Picker was not built with.
	ErrUnknownRoute = errors.New("route: unknown route")
	// ErrNotAcquired is returned by Release for a route with nothing in flight.
	ErrNotAcquired = errors.New("route: no attempt in flight")
)

// Route is one configured upstream route.
type Route struct {
	// Name is the route's subject-safe name.
	Name string
	// Labels describe the route's failure domain, e.g. LabelProvider and
	// LabelRegion; a missing label never counts as different.
	Labels map[string]string
	// Dialect is the API the route's provider speaks; empty means
	// schemas.DialectOpenAI. Route choice ignores it; the dispatcher refuses
	// a request some route of its pool could not receive.
	Dialect schemas.Dialect
}

// State is a route's health as shared through the budgets store.
type State uint8

const (
	// Healthy routes may be picked.
	Healthy State = iota
	// Pushback marks a route that asked for less load (429 Retry-After,
	// 529) until a time: no attempt is sent to it before then.
	Pushback
	// Quarantined marks a route with a route-local permanent failure (auth,
	// missing model) until a time.
	Quarantined
	// Ejected marks a route that failed too often (outlier ejection, see
	// Health) until a time; then it is probed back in. A pool whose every
	// route is out still sends its primaries to its ejected ones (panic
	// mode, PickPrimary).
	Ejected
)

func (s State) String() string {
	switch s {
	case Healthy:
		return "healthy"
	case Pushback:
		return "pushback"
	case Quarantined:
		return "quarantined"
	case Ejected:
		return "ejected"
	default:
		return fmt.Sprintf("State(%d)", uint8(s))
	}
}

// Options tunes a Picker.
type Options struct {
	// HalfLife is the half-life of the latency EWMA and of the success
	// ratio; zero means DefaultHalfLife.
	HalfLife time.Duration
	// StallHalfLife is the half-life of the stall share (ObserveStall);
	// zero means DefaultStallHalfLife.
	StallHalfLife time.Duration
}

// Picker holds what route choice needs per route: in-flight attempts, recent
// latency and health. It is safe for concurrent use; the *rand.Rand passed
// to the Pick methods is not, so each caller brings its own.
type Picker struct {
	halfLife, stallHalfLife time.Duration

	mu     sync.Mutex
	routes map[string]*routeState
}

type routeState struct {
	route    Route
	inFlight int
	state    State
	until    time.Time

	// sharedInFlight is the route's in-flight count across the cluster
	// (the workers' leases in the budgets store), trusted until
	// sharedUntil: the local count misses other replicas' attempts.
	sharedInFlight int
	sharedUntil    time.Time

	// The latency estimate (seconds), time-decayed at the half-life.
	latency decayedMean

	// unservedUntil: no worker took the route's last attempt (NATS had no
	// responders for its subject); until then the route is picked only
	// when nothing else is left. An Accept from the route clears it.
	unservedUntil time.Time

	// The success ratio is time-decayed the same way: okWeight and
	// failWeight are the decayed counts of the route's attempts that
	// succeeded and that failed transiently, as of outcomeSeen.
	okWeight, failWeight float64
	outcomeSeen          time.Time

	// The stall share is time-decayed the same way: stallWeight and
	// primaryWeight are the decayed counts of the route's primaries that
	// stalled and of all its primaries judged (ObserveStall), as of
	// stallSeen.
	stallWeight, primaryWeight float64
	stallSeen                  time.Time

	// The decode time (seconds a token), decayed as the latency: a
	// stream's time per output token after its first (ObserveDecode).
	decode decayedMean
}

// decayedMean is a time-decayed mean: every sample's weight halves each
// half-life, so the mean is sum / weight. Unlike a per-sample EWMA it fades
// at the same pace whether a route sees one sample a minute or a thousand
// a second.
type decayedMean struct {
	weight float64
	sum    float64 // Σ weight × sample
	seen   time.Time
}

// add takes one sample at now. A clock that steps backwards decays nothing.
func (m *decayedMean) add(sample float64, now time.Time, halfLife time.Duration) {
	d := decayFrom(m.seen, m.weight, now, halfLife)
	m.weight = m.weight*d + 1
	m.sum = m.sum*d + sample
	if now.After(m.seen) {
		m.seen = now
	}
}

// at is the mean at now, or ok=false without a sample or with stale ones
// only (their weight decayed below 2^-staleHalfLives).
func (m decayedMean) at(now time.Time, halfLife time.Duration) (float64, bool) {
	if m.weight == 0 || m.weight*decayFrom(m.seen, m.weight, now, halfLife) < math.Exp2(-staleHalfLives) {
		return 0, false
	}
	return m.sum / m.weight, true
}

// NewPicker returns a Picker for the given routes, all healthy, idle and
// without latency data.
func NewPicker(routes []Route, cfg Options) (*Picker, error) {
	if cfg.HalfLife < 0 {
		return nil, fmt.Errorf("route: picker: half-life %v must not be negative", cfg.HalfLife)
	}
	if cfg.StallHalfLife < 0 {
		return nil, fmt.Errorf("route: picker: stall half-life %v must not be negative", cfg.StallHalfLife)
	}
	if cfg.HalfLife == 0 {
		cfg.HalfLife = DefaultHalfLife
	}
	if cfg.StallHalfLife == 0 {
		cfg.StallHalfLife = DefaultStallHalfLife
	}
	p := &Picker{halfLife: cfg.HalfLife, stallHalfLife: cfg.StallHalfLife, routes: make(map[string]*routeState, len(routes))}
	for _, r := range routes {
		if r.Name == "" {
			return nil, errors.New("route: picker: route without a name")
		}
		if _, dup := p.routes[r.Name]; dup {
			return nil, fmt.Errorf("route: picker: route %q listed twice", r.Name)
		}
		labels := make(map[string]string, len(r.Labels))
		for k, v := range r.Labels {
			labels[k] = v
		}
		p.routes[r.Name] = &routeState{route: Route{Name: r.Name, Labels: labels}}
	}
	return p, nil
}

func (p *Picker) lookup(name string) (*routeState, error) {
	rs, ok := p.routes[name]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownRoute, name)
	}
	return rs, nil
}

// SetState records a route's health, as synced from the budgets store's
// shared route flags. until bounds Pushback, Quarantined and Ejected (the
// route is healthy again from then on) and is ignored for Healthy.
func (p *Picker) SetState(name string, s State, until time.Time) error {
	if s > Ejected {
		return fmt.Errorf("route: %q: invalid state %v", name, s)
	}
	return p.update(name, func(rs *routeState) {
		rs.state, rs.until = s, until
		if s == Healthy {
			rs.until = time.Time{}
		}
	})
}

// update applies f to the named route's state under the picker's lock.
func (p *Picker) update(name string, f func(*routeState)) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	rs, err := p.lookup(name)
	if err != nil {
		return err
	}
	f(rs)
	return nil
}

// MarkUnserved records that no worker of the route took an attempt (NATS
// answered its subject with no responders), so the next picks go elsewhere
// until until: a dead worker's route is known from its first refusal, not
// learnt again by every request (docs/architecture.md §5, "Route choice").
// Local to this picker: each replica sees the same bus, and learns it for
// itself at the same cost.
func (p *Picker) MarkUnserved(name string, until time.Time) error {
	return p.update(name, func(rs *routeState) { rs.unservedUntil = until })
}

// MarkServed clears MarkUnserved: a worker of the route took an attempt.
func (p *Picker) MarkServed(name string) error { return p.MarkUnserved(name, time.Time{}) }

// SetSharedInFlight records a route's in-flight count across the cluster,
// as read from the budgets store's route leases, valid until until: while
// it is fresh the primary's score counts the larger of it and the local
// count. A refresh that stops coming lets it lapse, and the local count
// alone decides again.
func (p *Picker) SetSharedInFlight(name string, n int, until time.Time) error {
	if n < 0 {
		return fmt.Errorf("route: %q: negative shared in-flight count %d", name, n)
	}
	return p.update(name, func(rs *routeState) { rs.sharedInFlight, rs.sharedUntil = n, until })
}

// Observe feeds one attempt's latency on a route into its estimate. The
// caller should measure the same thing on every route of a pool (time to
// first byte for streaming requests) so that scores compare.
func (p *Picker) Observe(name string, latency time.Duration, now time.Time) error {
	if latency < 0 {
		return fmt.Errorf("route: %q: negative latency %v", name, latency)
	}
	return p.update(name, func(rs *routeState) { rs.latency.add(latency.Seconds(), now, p.halfLife) })
}

// ObserveDecode feeds one answered stream's time per output token after
// its first into the route's decode estimate. A route's score counts only
// its time to the first token otherwise, so a route whose body comes at
// half its siblings' pace would draw as many streams while every one of
// them ended later (docs/architecture.md §5, "Route choice").
func (p *Picker) ObserveDecode(name string, perToken time.Duration, now time.Time) error {
	if perToken < 0 {
		return fmt.Errorf("route: %q: negative decode time %v", name, perToken)
	}
	return p.update(name, func(rs *routeState) { rs.decode.add(perToken.Seconds(), now, p.halfLife) })
}

// DecodeTime is the decode time per token an ended attempt tells of its
// route, the rule both drivers feed ObserveDecode by: for an answered
// stream (a continuation's tokens are counted from its prefix, so it is
// not one) with a first byte and at least two tokens, its time after the
// first byte over the tokens after the first.
func DecodeTime(stream bool, status schemas.StatusClass, elapsed, firstByte time.Duration, tokens int) (time.Duration, bool) {
	if !stream || status != schemas.StatusOK || firstByte <= 0 || elapsed < firstByte || tokens < 2 {
		return 0, false
	}
	return (elapsed - firstByte) / time.Duration(tokens-1), true
}

// decode returns the route's recent decode time per token in seconds, or
// ok=false without a fresh sample.
func (p *Picker) decode(rs *routeState, now time.Time) (float64, bool) {
	return rs.decode.at(now, p.halfLife)
}

// The score's decode factor: decode times under decodeFloor a token count
// alike (a reader sees no difference, and below it the samples are the
// path's jitter, not the provider's pace); a route decoding four times
// slower than its pool's median counts four times, no more, so one slow
// sample of a quiet route cannot take it out of the pool.
const (
	decodeFloor     = 0.001 // seconds a token
	minDecodeFactor = 0.25
	maxDecodeFactor = 4
)

// decodeFactor is the score's decode term: the route's decode time per
// token over its pool's median, each at least decodeFloor; 1 without data.
func (p *Picker) decodeFactor(rs *routeState, pr priors, now time.Time) float64 {
	d, ok := p.decode(rs, now)
	if !ok {
		return 1
	}
	return min(max(max(d, decodeFloor)/max(pr.decode, decodeFloor), minDecodeFactor), maxDecodeFactor)
}

// ObserveOutcome feeds how one attempt on a route ended into its success
// ratio: ok for an answer, !ok for a transient failure (an error, a reset,
// a malformed or invalid answer, a lost worker). Attempts that were
// cancelled, refused Busy, pushed back or quarantined say nothing of the
// route's health and are not fed. The score divides by the ratio, so a
// route that fails fast — little in flight, no latency sample, which would
// otherwise score like an idle fast route — stops drawing primaries after
// a failure or two.
func (p *Picker) ObserveOutcome(name string, ok bool, now time.Time) error {
	return p.update(name, func(rs *routeState) {
		d := p.decayFrom(rs.outcomeSeen, rs.okWeight+rs.failWeight, now)
		rs.okWeight *= d
		rs.failWeight *= d
		if ok {
			rs.okWeight++
		} else {
			rs.failWeight++
		}
		if now.After(rs.outcomeSeen) {
			rs.outcomeSeen = now
		}
	})
}

// ObserveStall feeds whether one primary on a route stalled into its stall
// share: stalled when its first byte came after its group's hedge delay, or
// had not come when a hedge was launched or when it ended past the delay
// (PrimaryState.Stalled says which, for both drivers). Primaries that ended
// before the delay without a first byte are not fed: they failed, which
// ObserveOutcome counts, or their caller left. The share multiplies the
// score, so a route whose primaries stall more often than its siblings'
// draws fewer primaries, and wins them back as the old stalls decay.
func (p *Picker) ObserveStall(name string, stalled bool, now time.Time) error {
	return p.update(name, func(rs *routeState) {
		d := p.stallDecay(rs, now)
		rs.stallWeight *= d
		rs.primaryWeight *= d
		rs.primaryWeight++
		if stalled {
			rs.stallWeight++
		}
		if now.After(rs.stallSeen) {
			rs.stallSeen = now
		}
	})
}

// The stall share's prior and floor (docs/architecture.md §5, "Route
// choice"). A route's share is drawn towards its pool's: the median share of
// the pool's routes with stall data, or stallPrior — what a hedge delay at
// the default P95 implies — when none has. The prior weighs
// stallPriorWeight primaries, so one stall of a fresh or quiet route moves
// its share a little, not to 1, and a route without data (new, quiet, or
// failing before any delay) is scored like its siblings, neither starved nor
// flooded. Below stallFloor — the P99's own share — a route's stalls cannot
// reach the pool's P99 on their own, so shares under it all count alike.
const (
	stallPrior       = 0.05
	stallPriorWeight = 20
	stallFloor       = 0.01
)

// stallShare is the route's decayed share of stalled primaries, drawn
// towards prior: (stalled + prior × stallPriorWeight) / (primaries +
// stallPriorWeight).
func (p *Picker) stallShare(rs *routeState, prior float64, now time.Time) float64 {
	d := p.stallDecay(rs, now)
	return (rs.stallWeight*d + prior*stallPriorWeight) / (rs.primaryWeight*d + stallPriorWeight)
}

// stallFactor is the score's stall term: the route's stall share relative to
// stallPrior, at least stallFloor's. A route stalling at stallPrior's share
// counts 1, twice as often 2.
func (p *Picker) stallFactor(rs *routeState, prior float64, now time.Time) float64 {
	return max(p.stallShare(rs, prior, now), stallFloor) / stallPrior
}

// priors are what a route without data of its own is scored at: its pool's
// median latency (seconds), median stall share and median decode time per
// token (seconds; 0 when no route has one).
type priors struct{ latency, stall, decode float64 }

// poolPriors computes the priors of pool at now. p.mu must be held.
func (p *Picker) poolPriors(pool []string, now time.Time) priors {
	return priors{latency: p.poolMedian(pool, now, p.latency), stall: p.poolStall(pool, now), decode: p.poolMedian(pool, now, p.decode)}
}

// poolStall is the median raw stall share over the pool's routes holding at
// least one (decayed) judged primary, whatever their health, or stallPrior
// when none does. p.mu must be held.
func (p *Picker) poolStall(pool []string, now time.Time) float64 {
	ss := make([]float64, 0, len(pool))
	for i, name := range pool {
		rs, ok := p.routes[name]
		if !ok || slices.Contains(pool[:i], name) {
			continue
		}
		if w := rs.primaryWeight * p.stallDecay(rs, now); w >= 1 {
			ss = append(ss, rs.stallWeight/rs.primaryWeight)
		}
	}
	return median(ss, stallPrior)
}

// median returns the median of xs (sorting it), or none when xs is empty.
func median(xs []float64, none float64) float64 {
	if len(xs) == 0 {
		return none
	}
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// PrimaryState is what a driver knows of a group's primary at one moment,
// for the stall rule both drivers apply (PrimaryState.Stalled).
type PrimaryState struct {
	// Delay is the group's hedge delay (the cohort's, whether or not the
	// group may hedge); zero or less: the group has none, nothing is judged.
	Delay time.Duration
	// Elapsed is the time since the primary's launch.
	Elapsed time.Duration
	// FirstByte is the primary's time from launch to its first byte; zero:
	// none yet.
	FirstByte time.Duration
	// Hedged is set once a hedge of the group was launched.
	Hedged bool
}

// Stalled judges a primary for its route's stall share: stalled when its
// first byte came after the delay, or when it has none and a hedge was
// launched or the delay has passed; not stalled when its first byte came
// within the delay. known is false while undecided — no first byte yet,
// no hedge, the delay not passed — so a driver asks again at the
// primary's first byte, at a hedge's launch and at the primary's end, and
// feeds the first known verdict, once.
func (s PrimaryState) Stalled() (stalled, known bool) {
	switch {
	case s.Delay <= 0:
		return false, false
	case s.FirstByte > 0:
		return s.FirstByte > s.Delay, true
	case s.Hedged || s.Elapsed >= s.Delay:
		return true, true
	}
	return false, false
}

// Verdict says what an ended attempt tells of its route's health, the rule
// both drivers feed ObserveOutcome and the outlier detection by: failed for
// a transient failure (an error, a reset, a malformed or invalid answer, a
// lost worker), ok for a valid answer; not counted for what says nothing of
// the route — an attempt the group cancelled, a Busy refusal, a pushback or
// quarantine (they have flags of their own), a request the group itself got
// wrong.
func Verdict(status schemas.StatusClass, scope schemas.ErrorScope, contractValid, cancelled bool) (failed, counted bool) {
	switch {
	case status == schemas.StatusOK && contractValid:
		return false, true
	case cancelled:
		return false, false
	case status == schemas.StatusBusy || status == schemas.StatusCanceled:
		return false, false
	case scope == schemas.ScopeTransient:
		return true, true
	}
	return false, false
}

// minSuccessRatio bounds the success ratio's divisor: a route that only
// fails scores 20 times its load-weighted latency, still finite so that a
// pool whose every route fails keeps choosing among them.
const minSuccessRatio = 0.05

// successRatio is the route's decayed share of successful attempts, with a
// prior of one success so that one failure of a fresh route halves it rather
// than zeroing it: (ok + 1) / (ok + failed + 1), at least minSuccessRatio.
func (p *Picker) successRatio(rs *routeState, now time.Time) float64 {
	d := p.decayFrom(rs.outcomeSeen, rs.okWeight+rs.failWeight, now)
	ok, failed := rs.okWeight*d, rs.failWeight*d
	return max((ok+1)/(ok+failed+1), minSuccessRatio)
}

// stallDecay is the factor by which a route's stall counts have shrunk
// since its last judged primary, at the stall half-life.
func (p *Picker) stallDecay(rs *routeState, now time.Time) float64 {
	return decayFrom(rs.stallSeen, rs.primaryWeight, now, p.stallHalfLife)
}

// decayFrom is the factor by which weights last updated at since have
// shrunk by now at the picker's half-life.
func (p *Picker) decayFrom(since time.Time, weight float64, now time.Time) float64 {
	return decayFrom(since, weight, now, p.halfLife)
}

// decayFrom is the factor by which weights last updated at since have
// shrunk by now at halfLife (1 when there are none or the clock stepped
// back).
func decayFrom(since time.Time, weight float64, now time.Time, halfLife time.Duration) float64 {
	dt := now.Sub(since)
	if weight == 0 || dt <= 0 {
		return 1
	}
	return math.Exp2(-dt.Seconds() / halfLife.Seconds())
}

// latency returns the route's recent latency in seconds, or ok=false when it
// has no sample or only stale ones.
func (p *Picker) latency(rs *routeState, now time.Time) (float64, bool) {
	return rs.latency.at(now, p.halfLife)
}

// Acquire counts one more attempt in flight on a route; call Release when it
// ends. The count feeds the primary's score.
func (p *Picker) Acquire(name string) error {
	return p.update(name, func(rs *routeState) { rs.inFlight++ })
}

// Release ends one in-flight attempt counted by Acquire.
func (p *Picker) Release(name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	rs, err := p.lookup(name)
	if err != nil {
		return err
	}
	if rs.inFlight == 0 {
		return fmt.Errorf("%w: %q", ErrNotAcquired, name)
	}
	rs.inFlight--
	return nil
}

// Stats is a snapshot of one route, for metrics (route_state) and tests.
type Stats struct {
	// InFlight counts this picker's attempts (Acquire, Release).
	InFlight int
	// SharedInFlight is the cluster's count while fresh, else 0.
	SharedInFlight int
	// Latency is the recent latency estimate; HasLatency is false when the
	// route has no fresh sample.
	Latency    time.Duration
	HasLatency bool
	// SuccessRatio is the decayed share of successful attempts, with a
	// prior of one success (ObserveOutcome); 1 for a route without outcomes.
	SuccessRatio float64
	// StallShare is the decayed share of the route's primaries that
	// stalled, drawn towards 0.05 (ObserveStall; a pick draws it towards
	// its pool's share instead); 0.05 for a route without data.
	StallShare float64
	// State is the state in force at the time asked: an expired pushback or
	// quarantine reads Healthy.
	State State
	Until time.Time
}

// Stats returns a snapshot of a route at now.
func (p *Picker) Stats(name string, now time.Time) (Stats, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rs, err := p.lookup(name)
	if err != nil {
		return Stats{}, err
	}
	st := Stats{InFlight: rs.inFlight, SuccessRatio: p.successRatio(rs, now), StallShare: p.stallShare(rs, stallPrior, now)}
	if rs.sharedFresh(now) {
		st.SharedInFlight = rs.sharedInFlight
	}
	if l, ok := p.latency(rs, now); ok {
		st.Latency, st.HasLatency = time.Duration(l*float64(time.Second)), true
	}
	if !rs.healthy(now) {
		st.State, st.Until = rs.state, rs.until
	}
	return st, nil
}

// sharedFresh reports whether the shared in-flight count is still trusted.
func (rs *routeState) sharedFresh(now time.Time) bool { return now.Before(rs.sharedUntil) }

// load is the in-flight count the score uses: the local count, or the
// cluster's when it is fresh and larger (it includes the local attempts
// once their workers' leases are seen).
func (rs *routeState) load(now time.Time) int {
	if rs.sharedFresh(now) {
		return max(rs.inFlight, rs.sharedInFlight)
	}
	return rs.inFlight
}

// healthy reports whether the route may receive an attempt at now.
func (rs *routeState) healthy(now time.Time) bool {
	return rs.state == Healthy || !now.Before(rs.until)
}

// served reports whether the route is not marked as having no worker at now.
func (rs *routeState) served(now time.Time) bool { return !now.Before(rs.unservedUntil) }

// PickPrimary picks the primary's route from a pool: among healthy routes
// (not quarantined, in pushback or ejected at now) it draws two at random
// and takes the one with the lower score, (in-flight + 1) × recent latency
// ÷ success ratio × stall factor, where in-flight is the larger of the
// local count and the fresh shared one (SetSharedInFlight) and the stall
// factor is the route's stall share over the prior's (ObserveStall). When
// no route of the pool is healthy but some are only ejected, it picks among
// those (panic mode, as Envoy's: ejection must never leave a pool without a
// route). A route without fresh latency data is scored at the median
// latency of the pool's routes that have it, so it is neither starved nor
// flooded; when none has data every route shares one neutral latency and
// the other terms decide. ok is false when no route of the pool is healthy.
func (p *Picker) PickPrimary(pool []string, now time.Time, rng *rand.Rand) (string, bool) {
	return p.PickPrimaryExcept(pool, nil, now, rng)
}

// PickPrimaryExcept is PickPrimary among the pool's routes not in exclude:
// where a primary goes when the routes in exclude cannot take it now (a
// provider key's limits spent, docs/architecture.md §7 "Route capacity").
// The pool's priors are still the whole pool's. ok is false when no other
// route may be picked.
func (p *Picker) PickPrimaryExcept(pool, exclude []string, now time.Time, rng *rand.Rand) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cands := p.eligible(pool, exclude, now)
	if len(cands) == 0 {
		cands = p.ejectedOnly(pool, exclude, now)
	}
	if len(cands) == 0 {
		// Every route the flags allow is marked as having no worker: one
		// may have come back since, and asking costs one no-responders.
		cands = p.unservedOnly(pool, exclude, now)
	}
	return p.twoChoices(cands, pool, now, rng)
}

// unservedOnly returns the pool's healthy routes not in exclude that are
// marked as having no worker, in pool order. p.mu must be held.
func (p *Picker) unservedOnly(pool, exclude []string, now time.Time) []*routeState {
	var out []*routeState
	for i, name := range pool {
		rs, ok := p.routes[name]
		if !ok || !rs.healthy(now) || rs.served(now) || slices.Contains(exclude, name) || slices.Contains(pool[:i], name) {
			continue
		}
		out = append(out, rs)
	}
	return out
}

// ejectedOnly returns the pool's routes not in exclude whose only flag in
// force is an ejection, in pool order. p.mu must be held.
func (p *Picker) ejectedOnly(pool, exclude []string, now time.Time) []*routeState {
	var out []*routeState
	for i, name := range pool {
		rs, ok := p.routes[name]
		if !ok || rs.healthy(now) || rs.state != Ejected || slices.Contains(exclude, name) || slices.Contains(pool[:i], name) {
			continue
		}
		out = append(out, rs)
	}
	return out
}

// PushedBack reports whether a route of pool is in pushback at now: what
// makes the pool's cohorts primary-only under pushback scope cohort
// (docs/architecture.md §4 rule 4). A route both in pushback and
// quarantined reads quarantined, as the shared flags rank them.
func (p *Picker) PushedBack(pool []string, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, name := range pool {
		if rs, ok := p.routes[name]; ok && rs.state == Pushback && !rs.healthy(now) {
			return true
		}
	}
	return false
}

// MayEject reports whether route name may be ejected from pool at now: the
// route must be in the pool and healthy, another route of the pool must
// stay healthy (the last healthy route of a pool is never ejected), and the
// routes of the pool ejected at now, this one included, must stay within
// maxPercent of the pool — at least one, as Envoy's max_ejection_percent.
func (p *Picker) MayEject(pool []string, name string, maxPercent int, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	rs, ok := p.routes[name]
	if !ok || !slices.Contains(pool, name) || !rs.healthy(now) {
		return false
	}
	healthy, ejected, n := 0, 1, 0
	for i, r := range pool {
		other, ok := p.routes[r]
		if !ok || slices.Contains(pool[:i], r) {
			continue
		}
		n++
		switch {
		case r == name:
		case other.healthy(now):
			healthy++
		case other.state == Ejected:
			ejected++
		}
	}
	return healthy > 0 && ejected <= max(1, n*maxPercent/100)
}

// PickHedge picks a hedge's or a replacement's route from a pool: a
// healthy route not in exclude (the routes this group already used),
// preferring, in order, one whose provider label differs from every
// excluded route's, then one whose region label differs from every
// excluded route's, then any other. Only if no such route exists and
// sameRouteAllowed is set may an excluded healthy route be reused. Within
// the preferred set it takes the route least likely to fail or stall now
// (risk: 1 − success ratio × (1 − stall share)), and among the routes
// about as safe the best-scored — not a random pair's better: a duplicate
// is sent because something already went wrong, usually into the group's
// last slot, and it must not meet a route known to be worse, even an idle
// one. Ties go to a uniform draw among them, or to the first in pool order
// without a random source. ok is false when nothing is eligible.
func (p *Picker) PickHedge(pool, exclude []string, now time.Time, rng *rand.Rand, sameRouteAllowed bool) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cands := p.eligible(pool, exclude, now)
	if len(cands) == 0 {
		if !sameRouteAllowed {
			return "", false
		}
		var used []*routeState
		for _, rs := range p.eligible(pool, nil, now) {
			if slices.Contains(exclude, rs.route.Name) {
				used = append(used, rs)
			}
		}
		return p.best(used, pool, now, rng)
	}
	excluded := make([]*routeState, 0, len(exclude))
	for _, name := range exclude {
		if rs, ok := p.routes[name]; ok {
			excluded = append(excluded, rs)
		}
	}
	for _, key := range []string{LabelProvider, LabelRegion} {
		var diverse []*routeState
		for _, rs := range cands {
			if differsFromAll(rs, excluded, key) {
				diverse = append(diverse, rs)
			}
		}
		if len(diverse) > 0 {
			return p.best(diverse, pool, now, rng)
		}
	}
	return p.best(cands, pool, now, rng)
}

// Risk margins of PickHedge and PickPrimary: a route is riskier than
// another only when its risk exceeds the other's by more than riskEvidence
// standard errors of the difference of two shares resting on the routes'
// judged primaries, and by riskSlack at least (docs/architecture.md §5,
// "Route choice"). The margin narrows as the shares firm up: a fresh
// route's first failure (0.53 against 0.05, on the priors' weight alone)
// lies beyond it at once, two stalls in a cold route's first twenty
// primaries do not; 7 % against 4.8 % — a route stalling twice as often as
// its siblings, diluted by the slow answers every route has past the delay
// — lies beyond it once the two rest on ~1,000 primaries each. A route that
// then loses primaries loses evidence too, so its margin widens again: a
// route whose lead was noise wins its pairings back instead of being
// starved on one unlucky run. A fixed margin was both too wide for a
// degraded route and too narrow for a cold pool's noise.
const (
	riskEvidence = 2
	riskSlack    = 0.005
)

// riskier reports whether risk ra, its stall share resting on na judged
// primaries, lies beyond the margins of risk rb resting on nb.
func riskier(ra, na, rb, nb float64) bool {
	mean := (ra + rb) / 2
	return ra-rb > max(riskSlack, riskEvidence*math.Sqrt(mean*(1-mean)*(1/na+1/nb)))
}

// evidence is how many judged primaries a route's stall share rests on,
// its prior's weight included (decayed at the stall half-life).
func (p *Picker) evidence(rs *routeState, now time.Time) float64 {
	return rs.primaryWeight*p.stallDecay(rs, now) + stallPriorWeight
}

// risk is the odds that an attempt on the route does not answer in time:
// 1 − success ratio × (1 − stall share). A fresh route reads 0.05, one
// failure of a fresh route 0.53.
func (p *Picker) risk(rs *routeState, pr priors, now time.Time) float64 {
	return 1 - p.successRatio(rs, now)*(1-p.stallShare(rs, pr.stall, now))
}

// best returns, among the candidates whose risk is within the margins of the
// lowest, the lowest-scored; ties go to a uniform draw among the tied, or
// to the first in pool order when rng is nil. A duplicate usually holds the
// group's last slot, so the odds that it fails or stalls weigh before the
// load it would wait behind. p.mu must be held.
func (p *Picker) best(cands []*routeState, pool []string, now time.Time, rng *rand.Rand) (string, bool) {
	if len(cands) == 0 {
		return "", false
	}
	pr := p.poolPriors(pool, now)
	risks := make([]float64, len(cands))
	safest := 0
	for i, rs := range cands {
		risks[i] = p.risk(rs, pr, now)
		if risks[i] < risks[safest] {
			safest = i
		}
	}
	lowN := p.evidence(cands[safest], now)
	var tied []*routeState
	lowScore := math.Inf(1)
	for i, rs := range cands {
		if riskier(risks[i], p.evidence(rs, now), risks[safest], lowN) {
			continue
		}
		switch sc := p.score(rs, pr, now); {
		case sc < lowScore:
			lowScore, tied = sc, append(tied[:0], rs)
		case sc == lowScore:
			tied = append(tied, rs)
		}
	}
	if rng == nil || len(tied) == 1 {
		return tied[0].route.Name, true
	}
	return tied[rng.IntN(len(tied))].route.Name, true
}

// differsFromAll reports whether rs carries label key with a value that no
// excluded route shares. A route without the label is never "different":
// nothing is known about its failure domain.
func differsFromAll(rs *routeState, excluded []*routeState, key string) bool {
	v := rs.route.Labels[key]
	if v == "" {
		return false
	}
	for _, e := range excluded {
		if ev := e.route.Labels[key]; ev == "" || ev == v {
			return false
		}
	}
	return true
}

// PickLeastLoaded picks where an attempt a worker of route busy refused
// (Busy, at its in-flight limit) is offered again: the healthy route of the
// pool other than busy with the lowest in-flight count (local or fresh
// shared, as for scores); ties go to the first after busy in the pool's
// cyclic order, so refusals spread over the pool instead of piling onto its
// first route (docs/architecture.md §4 rule 4). ok is false when no other
// route is healthy.
func (p *Picker) PickLeastLoaded(pool []string, busy string, now time.Time) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := slices.Index(pool, busy) + 1 // 0 when busy is not in the pool
	best, bestLoad := "", 0
	for i := range pool {
		name := pool[(start+i)%len(pool)]
		rs, ok := p.routes[name]
		if !ok || name == busy || !rs.healthy(now) || !rs.served(now) {
			continue
		}
		if l := rs.load(now); best == "" || l < bestLoad {
			best, bestLoad = name, l
		}
	}
	return best, best != ""
}

// eligible returns the pool's known, healthy routes not in exclude, in pool
// order (so that a seeded rng makes the same choice every run), each once.
// p.mu must be held.
func (p *Picker) eligible(pool, exclude []string, now time.Time) []*routeState {
	out := make([]*routeState, 0, len(pool))
	for i, name := range pool {
		rs, ok := p.routes[name]
		if !ok || !rs.healthy(now) || !rs.served(now) || slices.Contains(exclude, name) || slices.Contains(pool[:i], name) {
			continue
		}
		out = append(out, rs)
	}
	return out
}

// twoChoices draws two distinct candidates and returns the lower-scored one;
// a tie goes to the first draw, which is itself uniform. Without a random
// source it degrades to the best-scored candidate, first in pool order on
// ties, rather than failing. p.mu must be held.
func (p *Picker) twoChoices(cands []*routeState, pool []string, now time.Time, rng *rand.Rand) (string, bool) {
	switch len(cands) {
	case 0:
		return "", false
	case 1:
		return cands[0].route.Name, true
	}
	prior := p.poolPriors(pool, now)
	if rng == nil {
		best := cands[0]
		for _, rs := range cands[1:] {
			if p.better(rs, best, prior, now) {
				best = rs
			}
		}
		return best.route.Name, true
	}
	i := rng.IntN(len(cands))
	j := rng.IntN(len(cands) - 1)
	if j >= i {
		j++
	}
	a, b := cands[i], cands[j]
	if p.better(b, a, prior, now) {
		return b.route.Name, true
	}
	return a.route.Name, true
}

// better reports whether a primary should go to a rather than b: to the
// safer when one's risk is beyond the other's margins (riskier), else to
// the lower score. p.mu must be held.
func (p *Picker) better(a, b *routeState, pr priors, now time.Time) bool {
	ra, rb := p.risk(a, pr, now), p.risk(b, pr, now)
	na, nb := p.evidence(a, now), p.evidence(b, now)
	switch {
	case riskier(rb, nb, ra, na):
		return true
	case riskier(ra, na, rb, nb):
		return false
	}
	return p.score(a, pr, now) < p.score(b, pr, now)
}

// score is (in-flight + 1) × recent latency ÷ success ratio × stall
// factor × decode factor: the expected wait behind the route's current load, in-flight
// being the cluster's count while fresh, stretched by the attempts that
// would have to be made again, and by the odds that the primary lands in
// the pool's tail. Without the ratio a route that fails at once would score
// best: it holds nothing in flight and, reporting no first byte, has no
// latency of its own. Without the stall factor a route whose primaries
// often stall past the hedge delay would draw as many primaries as its
// siblings while its mean latency still looked fine: a stalled primary is
// hedged, and its group's answer waits at least the delay, so the pool's
// P99 is made of those groups and each route's primaries add to it in
// proportion to its stall share. Without the decode factor a stream's
// route would be judged by its first token alone, however slowly the rest
// came (docs/architecture.md §5, "Route choice").
func (p *Picker) score(rs *routeState, pr priors, now time.Time) float64 {
	l, ok := p.latency(rs, now)
	if !ok {
		l = pr.latency
	}
	return float64(rs.load(now)+1) * l / p.successRatio(rs, now) * p.stallFactor(rs, pr.stall, now) * p.decodeFactor(rs, pr, now)
}

// poolMedian is the median fresh estimate (latency or decode) over the
// pool's routes, whatever their health, or 1 when none has data; with no
// data at all the value is shared by every route and so breaks no ties.
// p.mu must be held.
func (p *Picker) poolMedian(pool []string, now time.Time, estimate func(*routeState, time.Time) (float64, bool)) float64 {
	ls := make([]float64, 0, len(pool))
	for i, name := range pool {
		rs, ok := p.routes[name]
		if !ok || slices.Contains(pool[:i], name) {
			continue
		}
		if l, ok := estimate(rs, now); ok {
			ls = append(ls, l)
		}
	}
	return median(ls, 1)
}
