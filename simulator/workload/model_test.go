package workload

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestByNameReturnsEveryBuiltInModelValid(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			m := mustModel(t, name)
			if m.Name != name {
				t.Errorf("Name = %q, want %q", m.Name, name)
			}
			if err := m.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

func TestByNameRejectsUnknownNameListingValidOnes(t *testing.T) {
	_, err := ByName("gpt5")
	if !errors.Is(err, ErrUnknownModel) {
		t.Fatalf("err = %v, want ErrUnknownModel", err)
	}
	for _, name := range append(Names(), "gpt5") {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not name %q", err, name)
		}
	}
}

func TestByNameReturnsIndependentCopies(t *testing.T) {
	a := mustModel(t, Degraded)
	a.TTFT.HangFraction = 0.5
	a.Degradation.Routes = 9
	b := mustModel(t, Degraded)
	if b.TTFT.HangFraction != 0.002 || b.Degradation.Routes != 3 {
		t.Errorf("changing one copy leaked into the next: hang %v, routes %d", b.TTFT.HangFraction, b.Degradation.Routes)
	}
}

func TestBuiltInModelsCarryTheirPinnedParameters(t *testing.T) {
	tests := []struct {
		name                 string
		mainMedian, stallMed float64
		stall, hang, tps     float64
		short                float64
		degradedRoutes       int
	}{
		{GPT4o, 0.62, 3.5, 0.023, 0.002, 130, 0, 0},
		{Sonnet, 0.90, 3.6, 0.045, 0.002, 104, 0, 0},
		{Mixed, 0.62, 3.5, 0.023, 0.002, 130, 0.5, 0},
		{Degraded, 0.62, 3.5, 0.023, 0.002, 130, 0, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := mustModel(t, tt.name)
			if !within(m.TTFT.Main.Median(), tt.mainMedian, 1e-9) || !within(m.TTFT.Stall.Median(), tt.stallMed, 1e-9) {
				t.Errorf("TTFT medians %v, %v; want %v, %v", m.TTFT.Main.Median(), m.TTFT.Stall.Median(), tt.mainMedian, tt.stallMed)
			}
			if m.TTFT.StallFraction != tt.stall || m.TTFT.HangFraction != tt.hang || m.TokensPerSecond != tt.tps {
				t.Errorf("stall %v hang %v tps %v; want %v %v %v", m.TTFT.StallFraction, m.TTFT.HangFraction, m.TokensPerSecond, tt.stall, tt.hang, tt.tps)
			}
			if m.ShortFraction != tt.short {
				t.Errorf("short fraction %v, want %v", m.ShortFraction, tt.short)
			}
			routes := 0
			if m.Degradation != nil {
				routes = m.Degradation.Routes
			}
			if routes != tt.degradedRoutes {
				t.Errorf("degraded routes %d, want %d", routes, tt.degradedRoutes)
			}
			if m.CancelLag != 200*time.Millisecond || m.ErrorFraction != 0.005 || m.MaxOutputTokens != 1000 {
				t.Errorf("cancel lag %v, error fraction %v, max output %d", m.CancelLag, m.ErrorFraction, m.MaxOutputTokens)
			}
		})
	}
}

func TestNewGeneratorRejectsInvalidModels(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Model)
	}{
		{"negative sigma", func(m *Model) { m.TTFT.Main.Sigma = -1 }},
		{"fractions above one", func(m *Model) { m.TTFT.StallFraction, m.TTFT.HangFraction = 0.9, 0.2 }},
		{"zero decode speed", func(m *Model) { m.TokensPerSecond = 0 }},
		{"zero output cap", func(m *Model) { m.MaxOutputTokens = 0 }},
		{"error delay bounds reversed", func(m *Model) { m.ErrorAfterMin, m.ErrorAfterMax = time.Second, time.Millisecond }},
		{"negative cancel lag", func(m *Model) { m.CancelLag = -time.Millisecond }},
		{"degraded with no routes", func(m *Model) { m.Degradation.Routes = 0 }},
		{"episode longer than cycle", func(m *Model) { m.Degradation.MaxEpisode = time.Hour }},
		{"common share above one", func(m *Model) { m.Degradation.CommonShare = 1.5 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := mustModel(t, Degraded)
			tt.mutate(m)
			if _, err := NewGenerator(m, 1); err == nil {
				t.Fatal("NewGenerator accepted an invalid model")
			}
		})
	}
	if _, err := NewGenerator(nil, 1); err == nil {
		t.Error("NewGenerator accepted a nil model")
	}
}
