package workload

import (
	"testing"
	"time"
)

// shiftFigures draws n attempts of distinct requests on route of the named
// model at start, and returns the stall share of the answered ones, their
// median decode speed and the attempts themselves.
func shiftFigures(t *testing.T, g *Generator, route int, start time.Duration, n int) (stallShare, medianTPS float64, as []Attempt) {
	t.Helper()
	p := mustProvider(t, g, route, RateLimit{})
	var stalls, ok int
	var tps []float64
	for id := range uint64(n) {
		a := mustAttempt(t, p, g.Request(id), 1, start)
		as = append(as, a)
		if a.Outcome != OutcomeOK {
			continue
		}
		ok++
		if a.Stalled {
			stalls++
		}
		tps = append(tps, 1/a.ITL.Seconds())
	}
	return float64(stalls) / float64(ok), quantile(tps, 0.5), as
}

func TestTheUnevenModelsDegradedRouteStallsTwiceAsOftenAndDecodesAtHalfSpeed(t *testing.T) {
	const n = 200_000
	plain := mustGenerator(t, mustModel(t, GPT4o), 5)
	uneven := mustGenerator(t, mustModel(t, Uneven), 5)
	tests := []struct {
		name        string
		route       int
		stall, tps  float64
		sameAsPlain bool
	}{
		{"the degraded route", 0, 2 * 0.023, 65, false},
		{"a healthy sibling", 1, 0.023, 130, true},
		{"the other healthy sibling", 2, 0.023, 130, true},
	}
	_, _, base := shiftFigures(t, plain, 0, time.Minute, n)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stall, tps, as := shiftFigures(t, uneven, tt.route, time.Minute, n)
			if !within(stall, tt.stall, 0.06) || !within(tps, tt.tps, 0.01) {
				t.Errorf("stall share %.4f, median %.1f tokens/s; want ≈ %.3f and %.0f", stall, tps, tt.stall, tt.tps)
			}
			if tt.sameAsPlain {
				_, _, want := shiftFigures(t, plain, tt.route, time.Minute, 2000)
				for i := range want {
					if as[i] != want[i] {
						t.Fatalf("attempt %d differs from gpt4o's on the same route: %+v vs %+v", i, as[i], want[i])
					}
				}
				return
			}
			// Common random numbers: what stalled on gpt4o's route stalls
			// on the degraded one too, at the same first byte.
			for i := range base {
				if base[i].Stalled && (!as[i].Stalled || as[i].FirstByte != base[i].FirstByte) {
					t.Fatalf("attempt %d stalled at %v on gpt4o; on the degraded route: stalled %v at %v",
						i, base[i].FirstByte, as[i].Stalled, as[i].FirstByte)
				}
			}
		})
	}
}

func TestTheDegradingModelsRouteTurnsAtTheMidpointOfTheRun(t *testing.T) {
	m := mustModel(t, Degrading)
	if m.Shift.From != DegradingAt {
		t.Fatalf("before ForRun the shift starts at %v, want %v", m.Shift.From, DegradingAt)
	}
	m.ForRun(2 * time.Hour)
	g := mustGenerator(t, m, 9)
	const n = 100_000
	tests := []struct {
		name  string
		route int
		at    time.Duration
		tps   float64
	}{
		{"route 0 before the midpoint is healthy", 0, time.Hour - time.Second, 130},
		{"route 0 from the midpoint is degraded", 0, time.Hour, 65},
		{"route 1 after the midpoint is healthy", 1, 90 * time.Minute, 130},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, tps, _ := shiftFigures(t, g, tt.route, tt.at, n); !within(tps, tt.tps, 0.01) {
				t.Errorf("median %.1f tokens/s, want ≈ %.0f", tps, tt.tps)
			}
		})
	}
	other := mustModel(t, Uneven)
	other.ForRun(2 * time.Hour)
	if other.Shift.From != 0 {
		t.Errorf("ForRun moved a whole-run shift to %v", other.Shift.From)
	}
}

func TestNewGeneratorRejectsInvalidShifts(t *testing.T) {
	tests := []struct {
		name   string
		base   string
		mutate func(*Model)
	}{
		{"negative route", Uneven, func(m *Model) { m.Shift.Route = -1 }},
		{"a route the degraded model lacks", Degraded, func(m *Model) { m.Shift = UnevenShift(); m.Shift.Route = 3 }},
		{"stall share above one", Uneven, func(m *Model) { m.Shift.StallFactor = 50 }},
		{"zero speed", Uneven, func(m *Model) { m.Shift.SpeedFactor = 0 }},
		{"negative start", Uneven, func(m *Model) { m.Shift.From = -time.Second }},
		{"fraction above one", Degrading, func(m *Model) { m.Shift.AtFraction = 1.5 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := mustModel(t, tt.base)
			tt.mutate(m)
			if _, err := NewGenerator(m, 1); err == nil {
				t.Fatal("NewGenerator accepted an invalid shift")
			}
		})
	}
}

func TestAGeneratorKeepsItsOwnCopyOfTheShift(t *testing.T) {
	m := mustModel(t, Uneven)
	g := mustGenerator(t, m, 1)
	m.Shift.SpeedFactor = 0.1
	got := g.Model()
	got.Shift.StallFactor = 9
	if s := g.Model().Shift; s.SpeedFactor != UnevenSpeedFactor || s.StallFactor != UnevenStallFactor {
		t.Errorf("the generator's shift changed with its model's: %+v", s)
	}
}
