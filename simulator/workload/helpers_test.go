package workload

import (
	"math"
	"sort"
	"testing"
	"time"
)

func mustModel(t testing.TB, name string) *Model {
	t.Helper()
	m, err := ByName(name)
	if err != nil {
		t.Fatalf("ByName(%q): %v", name, err)
	}
	return m
}

func mustGenerator(t testing.TB, m *Model, seed uint64) *Generator {
	t.Helper()
	g, err := NewGenerator(m, seed)
	if err != nil {
		t.Fatalf("NewGenerator(%s, %d): %v", m.Name, seed, err)
	}
	return g
}

func mustProvider(t testing.TB, g *Generator, route int, limit RateLimit) *Provider {
	t.Helper()
	p, err := g.Provider(route, limit)
	if err != nil {
		t.Fatalf("Provider(%d): %v", route, err)
	}
	return p
}

func mustAttempt(t testing.TB, p *Provider, req Request, number int, start time.Duration) Attempt {
	t.Helper()
	a, err := p.Attempt(req, number, start)
	if err != nil {
		t.Fatalf("Attempt(request %d, number %d, start %v): %v", req.ID, number, start, err)
	}
	return a
}

// quantile returns the q-quantile of xs (sorted in place), nearest rank.
func quantile(xs []float64, q float64) float64 {
	sort.Float64s(xs)
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[max(0, min(i, len(xs)-1))]
}

// within reports whether got is within rel (relative) of want.
func within(got, want, rel float64) bool { return math.Abs(got-want) <= rel*math.Abs(want) }

func meanStd(xs []float64) (mean, std float64) {
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	for _, x := range xs {
		std += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(std / float64(len(xs)-1))
}

func secondsToDuration(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
