package workload

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"time"
)

// ErrNoSuchRoute is returned for a route index the model does not have.
var ErrNoSuchRoute = errors.New("no such route")

// Generator is a Model with a seed: the source of Requests and Providers of
// one reproducible run. It is safe for concurrent use.
type Generator struct {
	model    Model
	seed     uint64
	schedule *schedule // nil unless the model degrades
}

// NewGenerator validates the model and seeds a generator with it. The model
// is copied: later changes to m do not affect the generator.
func NewGenerator(m *Model, seed uint64) (*Generator, error) {
	if m == nil {
		return nil, errors.New("workload: nil model")
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	g := &Generator{model: *m, seed: seed}
	if m.Degradation != nil {
		d := *m.Degradation
		g.model.Degradation = &d
		g.schedule = newSchedule(&d, seed)
	}
	if m.Shift != nil {
		sh := *m.Shift
		g.model.Shift = &sh
	}
	return g, nil
}

// Model returns a copy of the generator's parameters.
func (g *Generator) Model() Model {
	m := g.model
	if m.Degradation != nil {
		d := *m.Degradation
		m.Degradation = &d
	}
	if m.Shift != nil {
		sh := *m.Shift
		m.Shift = &sh
	}
	return m
}

// Seed returns the seed the generator was made with.
func (g *Generator) Seed() uint64 { return g.seed }

// Request is one user request. Its token counts are properties of the
// request, not of an attempt: every attempt of it, on any route, produces the
// same OutputTokens. A live server that honours max_tokens may lower
// OutputTokens before drawing attempts.
type Request struct {
	// ID identifies the request; attempts are keyed by it.
	ID uint64
	// InputTokens is the prompt size, billed for every attempt that reached
	// a provider.
	InputTokens int
	// OutputTokens is the full answer length, in [1, MaxOutputTokens].
	OutputTokens int
	// Short marks a request drawn from the short-output distribution.
	Short bool
}

// Request returns the request with the given id; the same generator seed and
// id always give the same request.
func (g *Generator) Request(id uint64) Request {
	r := newRand(g.seed, domainRequest, id)
	// Draw in a fixed order whatever the branch, so changing ShortFraction
	// does not shift the input or output draws of other requests.
	uShort := r.Float64()
	zIn := r.NormFloat64()
	zOut := r.NormFloat64()
	m := &g.model
	req := Request{ID: id, Short: uShort < m.ShortFraction}
	out := m.OutputTokens
	if req.Short {
		out = m.ShortOutputTokens
	}
	req.InputTokens = tokenCount(m.InputTokens.at(zIn), math.MaxInt32)
	req.OutputTokens = tokenCount(out.at(zOut), m.MaxOutputTokens)
	if m.Empirical != nil {
		req.Short = false
		req.InputTokens, req.OutputTokens = m.Empirical.request(uShort)
	}
	return req
}

// tokenCount rounds a continuous draw to a count in [1, max].
func tokenCount(x float64, max int) int {
	n := math.Round(x)
	if n < 1 {
		return 1
	}
	if n > float64(max) {
		return max
	}
	return int(n)
}

// RequestIDFromKey derives a request id from bytes that identify a request,
// e.g. the canonical request body a live server receives: the same body sent
// to two routes gets the same id, hence the same output length.
func RequestIDFromKey(key []byte) uint64 {
	h := fnv.New64a()
	h.Write(key) // hash.Hash.Write never returns an error
	return h.Sum64()
}

// Routes returns how many routes the model has, or 0 when any number of
// independent, identical routes may be used.
func (g *Generator) Routes() int {
	if g.model.Degradation != nil {
		return g.model.Degradation.Routes
	}
	return 0
}

func (g *Generator) checkRoute(route int) error {
	if route < 0 || (g.model.Degradation != nil && route >= g.model.Degradation.Routes) {
		n := "any index ≥ 0"
		if g.model.Degradation != nil {
			n = fmt.Sprintf("0..%d", g.model.Degradation.Routes-1)
		}
		return fmt.Errorf("%w %d in model %q (valid: %s)", ErrNoSuchRoute, route, g.model.Name, n)
	}
	return nil
}

// DegradedEpisodes returns the route's degraded episodes that overlap
// [0, until), in order; none for a model without degradation.
func (g *Generator) DegradedEpisodes(route int, until time.Duration) ([]Episode, error) {
	if err := g.checkRoute(route); err != nil {
		return nil, err
	}
	if g.schedule == nil {
		return nil, nil
	}
	return g.schedule.episodes(route, until), nil
}
