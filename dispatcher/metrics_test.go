package dispatcher

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/schemas"
)

// noSchemas is a schema cache that keeps nothing.
type noSchemas struct{}

func (noSchemas) Bytes() int64 { return 0 }
func (noSchemas) Entries() int { return 0 }

// TestEveryAttemptRoleHasItsSeriesFromTheStart: the series by role —
// attempts, wins, usage — exist at 0 for every role a dispatcher launches,
// the continuation of issue 30 included, before the first request, so a
// dashboard or an alert reads 0 rather than "no data".
func TestEveryAttemptRoleHasItsSeriesFromTheStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg, noSchemas{})
	if err != nil {
		t.Fatalf("newMetrics: %v", err)
	}
	m.createLabelSets(nil, nil)
	for _, role := range []schemas.Role{schemas.RolePrimary, schemas.RoleHedge, schemas.RoleReplacement, schemas.RoleContinuation} {
		tests := []struct {
			metric string
			labels map[string]string
		}{
			{"hedgerow_attempts_total", map[string]string{"role": string(role)}},
			{"hedgerow_wins_total", map[string]string{"role": string(role)}},
			{"hedgerow_usage_units_total", map[string]string{"role": string(role), "kind": "input"}},
			{"hedgerow_usage_units_total", map[string]string{"role": string(role), "kind": "output"}},
		}
		for _, tt := range tests {
			if got := gaugeValue(t, reg, tt.metric, tt.labels); got != 0 {
				t.Errorf("%s%v = %v before any request, want 0", tt.metric, tt.labels, got)
			}
		}
	}
}

// TestAContinuationCountsInTheDuplicateWindowAsAReplacementDoes: this
// replica's window counts a continuation as a replacement (budgets'
// ExtraRequest.FollowsAnEndedAttempt): an extra attempt the ceiling never
// refuses, so continuations, like replacements, can breach the ceiling
// and hedges cannot.
func TestAContinuationCountsInTheDuplicateWindowAsAReplacementDoes(t *testing.T) {
	c := budgets.DuplicateCeiling{Ceiling: 0.05, Window: time.Minute, Slots: 60}
	now := time.UnixMilli(1_700_000_000_000)
	tests := []struct {
		role     schemas.Role
		want     duplicateWindowRead // after breachMinPrimaries primaries and six of role
		breaches bool
	}{
		{schemas.RoleHedge, duplicateWindowRead{primaries: breachMinPrimaries, extras: 6}, false},
		{schemas.RoleReplacement, duplicateWindowRead{primaries: breachMinPrimaries, extras: 6, replacements: 6}, true},
		{schemas.RoleContinuation, duplicateWindowRead{primaries: breachMinPrimaries, extras: 6, replacements: 6}, true},
	}
	for _, tt := range tests {
		t.Run(string(tt.role), func(t *testing.T) {
			var d duplicateRates
			for range breachMinPrimaries {
				d.count("cohort", c, now, schemas.RolePrimary)
			}
			var got duplicateWindowRead
			for range 6 {
				got = d.count("cohort", c, now, tt.role)
			}
			if got != tt.want || got.breaches(c) != tt.breaches {
				t.Errorf("window %+v (breaches %v), want %+v (breaches %v)", got, got.breaches(c), tt.want, tt.breaches)
			}
		})
	}
}
