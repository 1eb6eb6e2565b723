package workload

import (
	"errors"
	"math"
	"testing"
	"time"
)

func TestEndDistributionTakesCensoredPrimariesOutOfTheRiskSet(t *testing.T) {
	s := time.Second
	tests := []struct {
		name string
		ends []PrimaryEnd
		want []EndAtom
	}{
		{
			name: "no censoring gives the empirical frequencies",
			ends: []PrimaryEnd{{At: s}, {At: 2 * s}, {At: 2 * s}, {At: 3 * s, Error: true}},
			want: []EndAtom{{At: s, P: 0.25}, {At: 2 * s, P: 0.5}, {At: 3 * s, Error: true, P: 0.25}},
		},
		{
			// At 1 s, 1 of 4 ends; the one cancelled at 2 s leaves the risk
			// set, so at 3 s 1 of 2 ends: (3/4)(1/2); at 4 s the last one.
			name: "a cancelled primary shifts its mass to the later ends",
			ends: []PrimaryEnd{{At: s}, {At: 2 * s, Censored: true}, {At: 3 * s}, {At: 4 * s, Error: true}},
			want: []EndAtom{{At: s, P: 0.25}, {At: 3 * s, P: 0.375}, {At: 4 * s, Error: true, P: 0.375}},
		},
		{
			name: "a primary cancelled at the time another ends is still at risk then",
			ends: []PrimaryEnd{{At: s, Censored: true}, {At: s}},
			want: []EndAtom{{At: s, P: 0.5}},
		},
		{
			name: "probability left past the last end is a hang",
			ends: []PrimaryEnd{{At: s}, {At: 30 * s, Censored: true}},
			want: []EndAtom{{At: s, P: 0.5}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := EndDistribution(tt.ends)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("atoms %+v, want %+v", got, tt.want)
			}
			for i := range got {
				if got[i].At != tt.want[i].At || got[i].Error != tt.want[i].Error || math.Abs(got[i].P-tt.want[i].P) > 1e-12 {
					t.Fatalf("atoms %+v, want %+v", got, tt.want)
				}
			}
		})
	}
}

func TestEndDistributionRefusesWhatItCannotEstimate(t *testing.T) {
	tests := []struct {
		name string
		ends []PrimaryEnd
	}{
		{"no primaries", nil},
		{"every primary cancelled before it ended", []PrimaryEnd{{At: time.Second, Censored: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := EndDistribution(tt.ends); !errors.Is(err, ErrEmptyEmpirical) {
				t.Errorf("err = %v, want ErrEmptyEmpirical", err)
			}
		})
	}
}

// An empirical model draws its attempts from the measured atoms: over many
// draws each outcome's share is its atom's probability, the rest hangs, and
// every first byte is one of the measured times.
func TestEmpiricalAttemptsFollowTheMeasuredEnds(t *testing.T) {
	e := &Empirical{
		Ends:   []EndAtom{{At: 600 * time.Millisecond, P: 0.7}, {At: 300 * time.Millisecond, Error: true, P: 0.1}, {At: 4 * time.Second, P: 0.15}},
		ITL:    []time.Duration{8 * time.Millisecond},
		Tokens: []TokenCounts{{Input: 700, Output: 100}, {Input: 50, Output: 3}},
	}
	m, err := EmpiricalModel("measured", e)
	if err != nil {
		t.Fatal(err)
	}
	g := mustGenerator(t, m, 5)
	p := mustProvider(t, g, 0, RateLimit{})
	const n = 50_000
	counts := map[time.Duration]int{}
	var errs, hangs int
	for id := range uint64(n) {
		req := g.Request(id)
		if (req.InputTokens != 700 || req.OutputTokens != 100) && (req.InputTokens != 50 || req.OutputTokens != 3) {
			t.Fatalf("request %d has %d/%d tokens, not a measured pair", id, req.InputTokens, req.OutputTokens)
		}
		a := mustAttempt(t, p, req, 0, 0)
		switch a.Outcome {
		case OutcomeOK:
			counts[a.FirstByte]++
			if a.End != a.FirstByte+time.Duration(req.OutputTokens)*8*time.Millisecond {
				t.Fatalf("attempt ends at %v, want first byte + %d × 8 ms", a.End, req.OutputTokens)
			}
		case OutcomeServerError:
			errs++
		case OutcomeHang:
			hangs++
		}
	}
	for _, c := range []struct {
		what string
		got  int
		want float64
	}{
		{"600 ms first bytes", counts[600*time.Millisecond], 0.7},
		{"4 s first bytes", counts[4*time.Second], 0.15},
		{"errors", errs, 0.1},
		{"hangs", hangs, 0.05},
	} {
		if share := float64(c.got) / n; math.Abs(share-c.want) > 0.01 {
			t.Errorf("%s: share %.4f, want %.2f", c.what, share, c.want)
		}
	}
	if len(counts) != 2 {
		t.Errorf("first bytes at %d distinct times, want the 2 measured", len(counts))
	}
}
