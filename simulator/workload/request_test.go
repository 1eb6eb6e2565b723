package workload

import (
	"math"
	"testing"
)

func TestSameSeedGivesIdenticalDraws(t *testing.T) {
	a := mustGenerator(t, mustModel(t, Degraded), 42)
	b := mustGenerator(t, mustModel(t, Degraded), 42)
	pa, pb := mustProvider(t, a, 1, RateLimit{}), mustProvider(t, b, 1, RateLimit{})
	for id := uint64(0); id < 2000; id++ {
		ra, rb := a.Request(id), b.Request(id)
		if ra != rb {
			t.Fatalf("request %d differs: %+v vs %+v", id, ra, rb)
		}
		start := secondsToDuration(float64(id) * 7.3)
		if x, y := mustAttempt(t, pa, ra, 0, start), mustAttempt(t, pb, rb, 0, start); x != y {
			t.Fatalf("attempt of request %d differs: %+v vs %+v", id, x, y)
		}
	}
}

func TestDifferentSeedGivesDifferentDraws(t *testing.T) {
	a := mustGenerator(t, mustModel(t, GPT4o), 1)
	b := mustGenerator(t, mustModel(t, GPT4o), 2)
	pa, pb := mustProvider(t, a, 0, RateLimit{}), mustProvider(t, b, 0, RateLimit{})
	sameReq, sameTTFT := 0, 0
	const n = 1000
	for id := uint64(0); id < n; id++ {
		ra, rb := a.Request(id), b.Request(id)
		if ra == rb {
			sameReq++
		}
		if mustAttempt(t, pa, ra, 0, 0).FirstByte == mustAttempt(t, pb, rb, 0, 0).FirstByte {
			sameTTFT++
		}
	}
	// Output lengths collide by chance now and then; whole requests and
	// nanosecond first bytes essentially never.
	if sameReq > n/100 || sameTTFT > n/100 {
		t.Errorf("seeds 1 and 2 agree on %d requests and %d first bytes of %d", sameReq, sameTTFT, n)
	}
}

func TestOutputLengthIsAPropertyOfTheRequest(t *testing.T) {
	g := mustGenerator(t, mustModel(t, GPT4o), 7)
	p0, p1 := mustProvider(t, g, 0, RateLimit{}), mustProvider(t, g, 1, RateLimit{})
	differ := 0
	const n = 1000
	for id := uint64(0); id < n; id++ {
		req := g.Request(id)
		a := mustAttempt(t, p0, req, 0, 0)
		b := mustAttempt(t, p1, req, 1, 0)
		c := mustAttempt(t, p0, req, 2, 0) // same route, later attempt
		if a.Request.OutputTokens != b.Request.OutputTokens || a.Request.OutputTokens != c.Request.OutputTokens {
			t.Fatalf("request %d: output lengths %d, %d, %d across attempts", id, a.Request.OutputTokens, b.Request.OutputTokens, c.Request.OutputTokens)
		}
		if a.Outcome != OutcomeOK || b.Outcome != OutcomeOK || c.Outcome != OutcomeOK {
			continue
		}
		for _, x := range []Attempt{a, b, c} {
			if got := x.BilledOutputTokens(Never); got != g.Request(id).OutputTokens {
				t.Fatalf("request %d attempt %d on route %d streamed %d tokens, want %d", id, x.Number, x.Route, got, g.Request(id).OutputTokens)
			}
		}
		if a.FirstByte != b.FirstByte && a.FirstByte != c.FirstByte && a.ITL != b.ITL {
			differ++
		}
	}
	if differ < n*90/100 {
		t.Errorf("only %d of %d requests drew independent latencies per attempt", differ, n)
	}
}

func TestTokenCountsFollowTheConversationTrace(t *testing.T) {
	g := mustGenerator(t, mustModel(t, GPT4o), 3)
	const n = 200_000
	lnIn, lnOut := make([]float64, 0, n), make([]float64, 0, n)
	for id := uint64(0); id < n; id++ {
		r := g.Request(id)
		if r.OutputTokens < 1 || r.OutputTokens > 1000 {
			t.Fatalf("request %d: output %d outside [1, 1000]", id, r.OutputTokens)
		}
		if r.InputTokens < 1 {
			t.Fatalf("request %d: input %d < 1", id, r.InputTokens)
		}
		if r.Short {
			t.Fatalf("request %d is short in a conversational model", id)
		}
		lnIn = append(lnIn, math.Log(float64(r.InputTokens)))
		lnOut = append(lnOut, math.Log(float64(r.OutputTokens)))
	}
	if mean, std := meanStd(lnIn); !within(mean, 6.63, 0.01) || !within(std, 0.99, 0.03) {
		t.Errorf("ln input tokens: mean %.3f std %.3f, want 6.63, 0.99", mean, std)
	}
	// The cap at 1000 trims the top 1.3% of outputs, so check the median and
	// the share at the cap rather than the moments.
	if med := math.Exp(quantile(lnOut, 0.5)); !within(med, math.Exp(5.02), 0.03) {
		t.Errorf("median output %.1f tokens, want %.1f", med, math.Exp(5.02))
	}
	atCap := 0
	for _, x := range lnOut {
		if x == math.Log(1000) {
			atCap++
		}
	}
	// P(LN(5.02, 0.86) ≥ 999.5) = 1 − Φ((ln 999.5 − 5.02)/0.86) ≈ 0.0141.
	if frac := float64(atCap) / n; !within(frac, 0.0141, 0.1) {
		t.Errorf("%.4f of outputs at the cap, want ≈ 0.0141", frac)
	}
}

func TestMixedHasAShortOutputHalf(t *testing.T) {
	g := mustGenerator(t, mustModel(t, Mixed), 5)
	const n = 100_000
	var short, long []float64
	for id := uint64(0); id < n; id++ {
		r := g.Request(id)
		if r.Short {
			short = append(short, float64(r.OutputTokens))
		} else {
			long = append(long, float64(r.OutputTokens))
		}
	}
	if frac := float64(len(short)) / n; !within(frac, 0.5, 0.02) {
		t.Errorf("short fraction %.3f, want 0.5", frac)
	}
	if med := quantile(short, 0.5); !within(med, math.Exp(2.79), 0.08) {
		t.Errorf("short median %.1f tokens, want ≈ %.1f", med, math.Exp(2.79))
	}
	if med := quantile(long, 0.5); !within(med, math.Exp(5.02), 0.03) {
		t.Errorf("conversational median %.1f tokens, want ≈ %.1f", med, math.Exp(5.02))
	}
}

func TestRequestIDFromKeyIsStablePerBody(t *testing.T) {
	a := RequestIDFromKey([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	b := RequestIDFromKey([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	c := RequestIDFromKey([]byte(`{"model":"m","messages":[{"role":"user","content":"ho"}]}`))
	if a != b || a == c {
		t.Errorf("ids %x, %x, %x: want equal bodies equal and different bodies different", a, b, c)
	}
}
