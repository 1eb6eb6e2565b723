package workload

import (
	"errors"
	"sync"
	"testing"
	"time"
)

func TestRateLimitRefusesWithRetryAfterWhenRequestsRunOut(t *testing.T) {
	g := mustGenerator(t, mustModel(t, GPT4o), 1)
	p := mustProvider(t, g, 0, RateLimit{RPM: 60})
	for id := uint64(0); id < 60; id++ {
		if a := mustAttempt(t, p, g.Request(id), 0, 0); a.Outcome == OutcomeRateLimited {
			t.Fatalf("attempt %d refused within a full bucket of 60", id)
		}
	}
	a := mustAttempt(t, p, g.Request(60), 0, 0)
	if a.Outcome != OutcomeRateLimited || a.Outcome.HTTPStatus() != 429 {
		t.Fatalf("61st attempt at once: outcome %v, want rate limited", a.Outcome)
	}
	if a.RetryAfter != time.Second {
		t.Errorf("RetryAfter %v, want 1s (one request refills per second at 60 RPM)", a.RetryAfter)
	}
	if a.End != 50*time.Millisecond || a.FirstByte != Never {
		t.Errorf("429 answered at %v with first byte %v, want 50ms and Never", a.End, a.FirstByte)
	}
	if a := mustAttempt(t, p, g.Request(61), 0, a.RetryAfter); a.Outcome == OutcomeRateLimited {
		t.Errorf("attempt after Retry-After refused again (retry %v)", a.RetryAfter)
	}
}

func TestRateLimitChargesInputAndOutputTokens(t *testing.T) {
	g := mustGenerator(t, mustModel(t, GPT4o), 1)
	p := mustProvider(t, g, 0, RateLimit{TPM: 6000})
	req := Request{ID: 9, InputTokens: 2000, OutputTokens: 1000} // 3000 tokens
	for i := range 2 {
		if a := mustAttempt(t, p, req, i, 0); a.Outcome == OutcomeRateLimited {
			t.Fatalf("attempt %d refused with 6000 TPM and 3000-token requests", i)
		}
	}
	a := mustAttempt(t, p, req, 2, 0)
	if a.Outcome != OutcomeRateLimited {
		t.Fatalf("third 3000-token attempt admitted by an empty 6000 TPM bucket")
	}
	if a.RetryAfter != 30*time.Second {
		t.Errorf("RetryAfter %v, want 30s (3000 tokens at 100 tokens/s)", a.RetryAfter)
	}
}

func TestRateLimitTreatsAnEarlierStartAsTheLatestSeen(t *testing.T) {
	g := mustGenerator(t, mustModel(t, GPT4o), 1)
	p := mustProvider(t, g, 0, RateLimit{RPM: 1})
	mustAttempt(t, p, g.Request(0), 0, time.Minute)
	// A late-arriving earlier start must not refill the bucket backwards.
	if a := mustAttempt(t, p, g.Request(1), 0, 30*time.Second); a.Outcome != OutcomeRateLimited || a.RetryAfter != time.Minute {
		t.Errorf("outcome %v retry %v, want rate limited for a full minute", a.Outcome, a.RetryAfter)
	}
}

func TestNoRateLimitByDefault(t *testing.T) {
	for _, a := range drawAttempts(t, GPT4o, 5, 20_000) {
		if a.Outcome == OutcomeRateLimited {
			t.Fatal("an attempt was rate limited without a configured limit")
		}
	}
}

func TestProviderRejectsUnknownRoutesAndBadLimits(t *testing.T) {
	deg := mustGenerator(t, mustModel(t, Degraded), 1)
	plain := mustGenerator(t, mustModel(t, GPT4o), 1)
	tests := []struct {
		name   string
		g      *Generator
		route  int
		limit  RateLimit
		noSuch bool
	}{
		{"degraded has three routes", deg, 3, RateLimit{}, true},
		{"negative route", plain, -1, RateLimit{}, true},
		{"negative RPM", plain, 0, RateLimit{RPM: -1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.g.Provider(tt.route, tt.limit)
			if err == nil || errors.Is(err, ErrNoSuchRoute) != tt.noSuch {
				t.Errorf("err = %v, want an error (ErrNoSuchRoute: %v)", err, tt.noSuch)
			}
		})
	}
	if _, err := plain.Provider(17, RateLimit{}); err != nil {
		t.Errorf("a non-degrading model refused route 17: %v", err)
	}
}

func TestProvidersAreSafeForConcurrentUse(t *testing.T) {
	g := mustGenerator(t, mustModel(t, Degraded), 8)
	serial := make([]Attempt, 300)
	{
		ref := mustGenerator(t, mustModel(t, Degraded), 8)
		for i := range serial {
			p := mustProvider(t, ref, i%3, RateLimit{})
			serial[i] = mustAttempt(t, p, ref.Request(uint64(i)), 0, time.Duration(i)*time.Second)
		}
	}
	providers := []*Provider{
		mustProvider(t, g, 0, RateLimit{}), mustProvider(t, g, 1, RateLimit{}), mustProvider(t, g, 2, RateLimit{}),
	}
	got := make([]Attempt, len(serial))
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each worker queries its route backwards, forcing the others'
			// lazy schedule extension to interleave with its lookups.
			for i := w + 3*((len(got)-1-w)/3); i >= 0; i -= 3 {
				a, err := providers[i%3].Attempt(g.Request(uint64(i)), 0, time.Duration(i)*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				got[i] = a
			}
		}()
	}
	wg.Wait()
	for i := range got {
		if got[i] != serial[i] {
			t.Fatalf("attempt %d differs under concurrency: %+v vs %+v", i, got[i], serial[i])
		}
	}
}
