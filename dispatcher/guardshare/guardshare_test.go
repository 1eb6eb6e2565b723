package guardshare

import (
	"context"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/internal/redistest"
)

var (
	t0     = time.UnixMilli(1_800_000_000_000)
	cohort = delay.NewCohort("chat", "gpt4o", true, 1024)
)

// replica is one dispatcher replica's guardrail of class "chat" and its
// sharer on the test's Redis.
type replica struct {
	g *delay.Guardrail
	s *Sharer
}

func newReplica(t *testing.T, rs *redistest.Server) replica {
	t.Helper()
	g, err := delay.NewGuardrail(delay.GuardrailOptions{CoolDown: 5 * time.Minute, ProbePeriod: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	client := rs.Client()
	s, err := New(client, "gstest", map[string]Guardrail{"chat": g}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return replica{g: g, s: s}
}

func (r replica) sync(t *testing.T, at time.Duration) {
	t.Helper()
	if err := r.s.SyncOnce(context.Background(), t0.Add(at)); err != nil {
		t.Fatalf("SyncOnce: %v", err)
	}
}

// TestADisablingOnOneReplicaHoldsOnEveryReplicaForItsCoolDown: replica A's
// cohort breaches its duplicate ceiling; after one sync each, replica B's
// cohort is disabled for the same reason since the same instant, and both
// probe again when that cool-down ends — not B five minutes later.
func TestADisablingOnOneReplicaHoldsOnEveryReplicaForItsCoolDown(t *testing.T) {
	rs := redistest.Start(t)
	a, b := newReplica(t, rs), newReplica(t, rs)
	if err := a.g.ReportBreach(cohort, t0, delay.ReasonDuplicateCeiling); err != nil {
		t.Fatal(err)
	}
	a.sync(t, time.Second)
	if s := b.g.Status(cohort, t0.Add(time.Second)); s.State != delay.StateEnabled {
		t.Fatalf("B before its own sync: %s, want enabled", s.State)
	}
	b.sync(t, 2*time.Second)
	s := b.g.Status(cohort, t0.Add(2*time.Second))
	if s.State != delay.StateDisabled || s.Reason != delay.ReasonDuplicateCeiling || !s.Since.Equal(t0) {
		t.Fatalf("B after its sync: %s/%s since %v, want disabled/duplicate_ceiling since A's breach", s.State, s.Reason, s.Since)
	}
	for name, r := range map[string]replica{"A": a, "B": b} {
		if d := r.g.Decide(cohort, t0.Add(5*time.Minute)); d.State != delay.StateProbing {
			t.Fatalf("%s at the end of the cool-down: %s, want probing", name, d.State)
		}
	}
	// The ended disabling is no longer adopted, and its field is gone.
	b.sync(t, 5*time.Minute+time.Second)
	if s := b.g.Status(cohort, t0.Add(5*time.Minute+time.Second)); s.State != delay.StateProbing {
		t.Fatalf("B after a sync past the cool-down: %s, want still probing", s.State)
	}
	n, err := rs.Client().HLen(context.Background(), "gstest:{gr:chat}").Result()
	if err != nil || n != 0 {
		t.Fatalf("hash holds %d fields (%v), want the ended disabling deleted", n, err)
	}
}

func TestSharingDownLeavesEachReplicaDecidingAlone(t *testing.T) {
	rs := redistest.Start(t)
	a := newReplica(t, rs)
	if err := a.g.ReportBreach(cohort, t0, delay.ReasonSpendCeiling); err != nil {
		t.Fatal(err)
	}
	rs.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.s.SyncOnce(ctx, t0.Add(time.Second)); err == nil {
		t.Fatal("SyncOnce with Redis stopped: no error")
	}
	if s := a.g.Status(cohort, t0.Add(time.Second)); s.State != delay.StateDisabled || s.Reason != delay.ReasonSpendCeiling {
		t.Fatalf("local state %s/%s after a failed sync, want its own disabling kept", s.State, s.Reason)
	}
}
