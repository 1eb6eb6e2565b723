package workload

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// RateLimit is a route's per-minute request and token allowance, enforced as
// two continuously refilling token buckets that start full. Zero in a field
// means that dimension is unlimited; the zero RateLimit is no limit (the
// default of every built-in model).
type RateLimit struct {
	// RPM is requests per minute.
	RPM int
	// TPM is tokens per minute; an attempt is charged its request's input
	// plus output tokens when admitted (a request larger than the whole
	// bucket is charged the whole bucket, so it waits for a full refill
	// rather than being refused forever).
	TPM int
}

func (l RateLimit) validate() error {
	if l.RPM < 0 || l.TPM < 0 {
		return fmt.Errorf("rate limit RPM %d, TPM %d: must be ≥ 0", l.RPM, l.TPM)
	}
	return nil
}

// Provider is one route of a Generator's model: it draws attempts and holds
// the route's state over time (rate-limit buckets; the degradation schedule
// is shared by the generator's routes). It is safe for concurrent use.
type Provider struct {
	g     *Generator
	route int
	limit RateLimit

	mu       sync.Mutex
	seen     bool
	last     time.Duration
	requests float64 // bucket fill
	tokens   float64
}

// Provider returns route's provider with the given rate limit. Each call
// returns a provider with fresh (full) buckets; make one per route per run.
func (g *Generator) Provider(route int, limit RateLimit) (*Provider, error) {
	if err := g.checkRoute(route); err != nil {
		return nil, err
	}
	if err := limit.validate(); err != nil {
		return nil, fmt.Errorf("route %d: %w", route, err)
	}
	return &Provider{g: g, route: route, limit: limit, requests: float64(limit.RPM), tokens: float64(limit.TPM)}, nil
}

// Route returns the provider's route index.
func (p *Provider) Route() int { return p.route }

// Degraded reports whether the route is degraded at model time at; always
// false for a model without degradation.
func (p *Provider) Degraded(at time.Duration) bool {
	return p.g.schedule != nil && p.g.schedule.degraded(p.route, max(at, 0))
}

// ErrInvalidAttempt is returned by Attempt for arguments no run can produce.
var ErrInvalidAttempt = errors.New("invalid attempt")

// Attempt draws attempt number of req, reaching this route at model time
// start. The draws are a pure function of (seed, request id, route, number);
// the route's state at start decides degradation and rate limiting. Callers
// should advance start monotonically per provider; a start earlier than one
// already seen (concurrent live callers) is admitted against the buckets as
// if it came at the latest time seen.
func (p *Provider) Attempt(req Request, number int, start time.Duration) (Attempt, error) {
	switch {
	case start < 0:
		return Attempt{}, fmt.Errorf("%w: start %v is before the run began", ErrInvalidAttempt, start)
	case number < 0:
		return Attempt{}, fmt.Errorf("%w: attempt number %d is negative", ErrInvalidAttempt, number)
	case req.OutputTokens < 1 || req.InputTokens < 0:
		return Attempt{}, fmt.Errorf("%w: request %d has %d input and %d output tokens (want ≥ 0 and ≥ 1)",
			ErrInvalidAttempt, req.ID, req.InputTokens, req.OutputTokens)
	}
	m := &p.g.model
	a := Attempt{Request: req, Route: p.route, Number: number, Start: start, cancelLag: m.CancelLag}

	if retry, ok := p.admit(req, start); !ok {
		a.Outcome, a.FirstByte, a.End, a.RetryAfter = OutcomeRateLimited, Never, m.RejectAfter, retry
		return a, nil
	}

	// Every draw is taken, in this order, whatever the branch: the same
	// attempt then sees the same numbers under every model variant and
	// route state (common random numbers make strategy comparisons sharper).
	r := newRand(p.g.seed, domainAttempt, req.ID, uint64(p.route), uint64(number))
	uErr, uMix, zTTFT, zITL, uErrAfter := r.Float64(), r.Float64(), r.NormFloat64(), r.NormFloat64(), r.Float64()

	if m.Empirical != nil {
		return m.Empirical.attempt(a, uMix, zITL), nil
	}
	errFraction, ttftFactor := m.ErrorFraction, 1.0
	if p.Degraded(start) {
		a.Degraded = true
		errFraction, ttftFactor = m.Degradation.ErrorFraction, m.Degradation.TTFTFactor
	}
	if uErr < errFraction {
		a.Outcome, a.FirstByte = OutcomeServerError, Never
		a.End = m.ErrorAfterMin + time.Duration(uErrAfter*float64(m.ErrorAfterMax-m.ErrorAfterMin))
		return a, nil
	}
	stallFraction, tokensPerSecond := m.TTFT.StallFraction, m.TokensPerSecond
	if m.Shift.shifted(p.route, start) {
		stallFraction, tokensPerSecond = stallFraction*m.Shift.StallFactor, tokensPerSecond*m.Shift.SpeedFactor
	}
	mode := m.TTFT.Main
	switch {
	case uMix < m.TTFT.HangFraction:
		a.Outcome, a.FirstByte, a.End = OutcomeHang, Never, Never
		return a, nil
	case uMix < m.TTFT.HangFraction+stallFraction:
		a.Stalled, mode = true, m.TTFT.Stall
	}
	a.Outcome = OutcomeOK
	a.FirstByte = durationOf(mode.at(zTTFT) * ttftFactor)
	a.ITL = durationOf(math.Exp(m.ITLSigma*zITL) / tokensPerSecond)
	a.End = addSaturating(a.FirstByte, durationMul(a.ITL, req.OutputTokens))
	return a, nil
}

// admit charges the route's buckets for an attempt at start, or returns how
// long until they could admit it.
func (p *Provider) admit(req Request, start time.Duration) (time.Duration, bool) {
	if p.limit == (RateLimit{}) {
		return 0, true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.seen || start > p.last {
		if p.seen {
			// Buckets refill continuously at limit/60 per second.
			elapsed := (start - p.last).Seconds()
			p.requests = math.Min(float64(p.limit.RPM), p.requests+elapsed*float64(p.limit.RPM)/60)
			p.tokens = math.Min(float64(p.limit.TPM), p.tokens+elapsed*float64(p.limit.TPM)/60)
		}
		p.seen, p.last = true, start
	}
	cost := math.Min(float64(req.InputTokens+req.OutputTokens), float64(p.limit.TPM))
	var wait float64 // seconds until both buckets hold enough
	if p.limit.RPM > 0 && p.requests < 1 {
		wait = math.Max(wait, (1-p.requests)*60/float64(p.limit.RPM))
	}
	if p.limit.TPM > 0 && p.tokens < cost {
		wait = math.Max(wait, (cost-p.tokens)*60/float64(p.limit.TPM))
	}
	if wait > 0 {
		return max(time.Duration(math.Ceil(wait*1e9)), 1), false
	}
	if p.limit.RPM > 0 {
		p.requests--
	}
	if p.limit.TPM > 0 {
		p.tokens -= cost
	}
	return 0, true
}

// durationOf converts seconds to a Duration, saturating at Never.
func durationOf(s float64) time.Duration {
	ns := math.Round(s * 1e9)
	if !(ns < float64(Never)) {
		return Never
	}
	return time.Duration(ns)
}

func durationMul(d time.Duration, n int) time.Duration {
	if n > 0 && d > Never/time.Duration(n) {
		return Never
	}
	return d * time.Duration(n)
}
