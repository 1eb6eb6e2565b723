package budgets

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// manualClock is a clock for single-goroutine tests.
type manualClock struct{ now time.Time }

func (c *manualClock) Now() time.Time { return c.now }

func testAdmitRequest(ua string) AdmitRequest {
	return AdmitRequest{
		UserAction: ua,
		Tenant:     "tenant",
		Pool:       "pool",
		Window:     "cohort",
		Attempts:   AttemptPolicy{Max: 2, TTL: time.Minute},
		Spend: SpendPolicy{
			InputUnits: 10, OutputUnits: 10, TenantCeiling: 1000, TenantWindow: time.Hour,
			ReservationTTL: time.Minute,
		},
		Duplicates: DuplicateCeiling{Ceiling: 0.1, Window: 10 * time.Second, Slots: 10},
	}
}

func TestMemoryForgetsEntitiesPastTheirLifetime(t *testing.T) {
	ctx := t.Context()
	clock := &manualClock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	m := NewMemory(clock.Now)

	held, err := m.Admit(ctx, testAdmitRequest("ua-held"))
	if err != nil || !held.Allowed {
		t.Fatalf("Admit: %+v, %v", held, err)
	}
	if _, err := m.Admit(ctx, testAdmitRequest("ua-settled")); err != nil {
		t.Fatalf("Admit: %v", err)
	}
	if _, err := m.ReserveExtra(ctx, ExtraRequest{
		Role: schemas.RoleHedge, UserAction: "ua-hedge", Route: "route", Pool: "pool", Window: "cohort",
		Attempts: AttemptPolicy{Max: 1, TTL: time.Minute}, Spend: SpendPolicy{ReservationTTL: time.Minute},
		Duplicates: DuplicateCeiling{Ceiling: 0.1, Window: 10 * time.Second, Slots: 10},
		Reserve:    ReserveBucket{Capacity: 1},
	}); err != nil {
		t.Fatalf("ReserveExtra: %v", err)
	}
	if err := m.MarkRoute(ctx, "route", RouteQuarantined, time.Minute); err != nil {
		t.Fatalf("MarkRoute: %v", err)
	}
	if err := m.AcquireLease(ctx, "route", "holder", time.Minute); err != nil {
		t.Fatalf("AcquireLease: %v", err)
	}
	if m.entities() == 0 {
		t.Fatal("no entities recorded")
	}

	clock.now = clock.now.Add(BucketIdleTTL + sweepInterval)
	if _, err := m.RouteStates(ctx, nil); err != nil {
		t.Fatalf("RouteStates: %v", err)
	}
	if n := m.entities(); n != 0 {
		t.Errorf("%d entities left a day after their last use, want 0", n)
	}
	if err := m.Settle(ctx, held.Reservation, schemas.Usage{}); !errors.Is(err, ErrUnknownReservation) {
		t.Errorf("Settle of a forgotten reservation: %v, want ErrUnknownReservation", err)
	}
}

func TestMemoryRefusesEndedContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	m := NewMemory(nil) // the wall clock: these calls never get as far as reading it
	calls := map[string]func() error{
		"Admit": func() error { _, err := m.Admit(ctx, testAdmitRequest("ua")); return err },
		"ReserveExtra": func() error {
			_, err := m.ReserveExtra(ctx, ExtraRequest{Role: schemas.RoleReplacement})
			return err
		},
		"Settle":       func() error { return m.Settle(ctx, "r", schemas.Usage{}) },
		"Release":      func() error { return m.Release(ctx, "r") },
		"MarkRoute":    func() error { return m.MarkRoute(ctx, "route", RoutePushback, time.Second) },
		"RouteStates":  func() error { _, err := m.RouteStates(ctx, []string{"route"}); return err },
		"AcquireLease": func() error { return m.AcquireLease(ctx, "route", "h", time.Second) },
		"ReleaseLease": func() error { return m.ReleaseLease(ctx, "route", "h") },
		"InFlight":     func() error { _, err := m.InFlight(ctx, []string{"route"}); return err },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled context: %v, want context.Canceled", name, err)
		}
	}
	if n := m.entities(); n != 0 {
		t.Errorf("%d entities after refused calls, want 0", n)
	}
}

func TestWindowSlotAlignsToUnixEpoch(t *testing.T) {
	tests := []struct {
		now  time.Time
		slot time.Duration
		want int64
	}{
		{time.UnixMilli(0), time.Second, 0},
		{time.UnixMilli(999), time.Second, 0},
		{time.UnixMilli(1_000), time.Second, 1},
		{time.UnixMilli(2_500), 250 * time.Millisecond, 10},
		{time.UnixMilli(-1), time.Second, -1},
		{time.UnixMilli(-1_000), time.Second, -1},
		{time.UnixMilli(-1_001), time.Second, -2},
	}
	for _, tt := range tests {
		if got := WindowSlot(tt.now, tt.slot); got != tt.want {
			t.Errorf("WindowSlot(%d ms, %v) = %d, want %d", tt.now.UnixMilli(), tt.slot, got, tt.want)
		}
	}
}

func TestTenantWindowStartAlignsToUnixEpoch(t *testing.T) {
	tests := []struct {
		now    time.Time
		window time.Duration
		want   int64
	}{
		{time.UnixMilli(0), time.Hour, 0},
		{time.UnixMilli(3_599_999), time.Hour, 0},
		{time.UnixMilli(3_600_000), time.Hour, 3_600_000},
		{time.UnixMilli(7_000), 7 * time.Second, 7_000},
		{time.UnixMilli(6_999), 7 * time.Second, 0},
		{time.UnixMilli(-1), time.Second, -1_000},
		{time.UnixMilli(-1_000), time.Second, -1_000},
	}
	for _, tt := range tests {
		if got := TenantWindowStart(tt.now, tt.window); got != tt.want {
			t.Errorf("TenantWindowStart(%d ms, %v) = %d, want %d", tt.now.UnixMilli(), tt.window, got, tt.want)
		}
	}
}
