package workload

import (
	"errors"
	"math"
	"testing"
	"time"
)

// drawAttempts draws one attempt of each of n requests on route 0, spread
// over time.
func drawAttempts(t *testing.T, name string, seed uint64, n int) []Attempt {
	t.Helper()
	g := mustGenerator(t, mustModel(t, name), seed)
	p := mustProvider(t, g, 0, RateLimit{})
	out := make([]Attempt, n)
	for i := range out {
		out[i] = mustAttempt(t, p, g.Request(uint64(i)), 0, time.Duration(i)*20*time.Millisecond)
	}
	return out
}

// The fidelity target of docs/architecture.md §11: strategy `none`, streaming, pinned
// conditions → P50 0.63 s, P99 ≈ 5.8 s. Latency is the first byte; a failed
// group (a hang or a 5xx: 0.7% together) counts at the 30 s deadline, which
// is what puts P99 in the stall mode's tail at ≈ 5.8 s (with hangs alone it
// would be ≈ 4.2 s).
func TestGPT4oStreamingBaselineMatchesTheReference(t *testing.T) {
	c := PinnedConditions()
	attempts := drawAttempts(t, GPT4o, 11, 200_000)
	lat := make([]float64, len(attempts))
	for i, a := range attempts {
		lat[i] = c.LatencyAtDeadline(a.FirstByte, a.Outcome != OutcomeOK).Seconds()
	}
	tests := []struct {
		q, want float64
	}{
		{0.50, 0.63},
		{0.99, 5.8},
		{0.999, 30},
	}
	for _, tt := range tests {
		got := quantile(lat, tt.q)
		t.Logf("P%v = %.3f s (reference %.2f s)", tt.q*100, got, tt.want)
		if !within(got, tt.want, 0.10) {
			t.Errorf("P%v = %.3f s, want %.2f s ± 10%%", tt.q*100, got, tt.want)
		}
	}
}

func TestTTFTMixtureMatchesItsFit(t *testing.T) {
	tests := []struct {
		model                   string
		stall, hang             float64
		mainMedian, stallMedian float64
	}{
		{GPT4o, 0.023, 0.002, 0.62, 3.5},
		{Sonnet, 0.045, 0.002, 0.90, 3.6},
		{Mixed, 0.023, 0.002, 0.62, 3.5},
	}
	for _, tt := range tests {
		t.Run(tt.model, func(t *testing.T) {
			attempts := drawAttempts(t, tt.model, 21, 200_000)
			var served, stalls, hangs, errs int
			var mainTTFT, stallTTFT []float64
			for _, a := range attempts {
				switch a.Outcome {
				case OutcomeServerError:
					errs++
					continue
				case OutcomeHang:
					hangs++
				case OutcomeOK:
					if a.Stalled {
						stalls++
						stallTTFT = append(stallTTFT, a.FirstByte.Seconds())
					} else {
						mainTTFT = append(mainTTFT, a.FirstByte.Seconds())
					}
				default:
					t.Fatalf("unexpected outcome %v", a.Outcome)
				}
				served++
			}
			n := float64(len(attempts))
			if got := float64(errs) / n; !within(got, 0.005, 0.15) {
				t.Errorf("5xx fraction %.4f, want 0.005", got)
			}
			if got := float64(stalls) / float64(served); !within(got, tt.stall, 0.08) {
				t.Errorf("stall fraction %.4f, want %v", got, tt.stall)
			}
			if got := float64(hangs) / float64(served); !within(got, tt.hang, 0.2) {
				t.Errorf("hang fraction %.4f, want %v", got, tt.hang)
			}
			if got := quantile(mainTTFT, 0.5); !within(got, tt.mainMedian, 0.02) {
				t.Errorf("main-mode median %.3f s, want %v", got, tt.mainMedian)
			}
			if got := quantile(stallTTFT, 0.5); !within(got, tt.stallMedian, 0.05) {
				t.Errorf("stall-mode median %.3f s, want %v", got, tt.stallMedian)
			}
		})
	}
}

func TestServerErrorsAnswerWithinTheirWindow(t *testing.T) {
	for _, a := range drawAttempts(t, GPT4o, 31, 100_000) {
		if a.Outcome != OutcomeServerError {
			continue
		}
		if a.End < 200*time.Millisecond || a.End > 500*time.Millisecond {
			t.Fatalf("5xx after %v, want within [200ms, 500ms]", a.End)
		}
		if a.FirstByte != Never || a.TokensBy(Never) != 0 {
			t.Fatalf("5xx attempt streams: first byte %v, %d tokens", a.FirstByte, a.TokensBy(Never))
		}
		if a.Outcome.HTTPStatus() != 500 {
			t.Fatalf("5xx outcome answers HTTP %d", a.Outcome.HTTPStatus())
		}
	}
}

func TestDecodeFollowsTheModelsTokensPerSecond(t *testing.T) {
	for _, tt := range []struct {
		model string
		tps   float64
	}{{GPT4o, 130}, {Sonnet, 104}} {
		t.Run(tt.model, func(t *testing.T) {
			var lnITL []float64
			for _, a := range drawAttempts(t, tt.model, 41, 50_000) {
				if a.Outcome != OutcomeOK {
					continue
				}
				if want := a.FirstByte + time.Duration(a.Request.OutputTokens)*a.ITL; a.End != want {
					t.Fatalf("End %v, want TTFT + N×ITL = %v", a.End, want)
				}
				lnITL = append(lnITL, math.Log(a.ITL.Seconds()))
			}
			mean, std := meanStd(lnITL)
			if got := math.Exp(mean); !within(got, 1/tt.tps, 0.01) {
				t.Errorf("median ITL %v s, want %v s", got, 1/tt.tps)
			}
			if !within(std, 0.12, 0.05) {
				t.Errorf("σ of ln ITL %.4f, want 0.12", std)
			}
		})
	}
}

func TestTokenTimePacesTheStream(t *testing.T) {
	a := Attempt{
		Request:   Request{OutputTokens: 3},
		Outcome:   OutcomeOK,
		FirstByte: 600 * time.Millisecond,
		ITL:       10 * time.Millisecond,
		End:       630 * time.Millisecond,
	}
	tests := []struct {
		k    int
		want time.Duration
	}{
		{0, Never},
		{1, 600 * time.Millisecond},
		{2, 610 * time.Millisecond},
		{3, 620 * time.Millisecond},
		{4, Never},
	}
	for _, tt := range tests {
		if got := a.TokenTime(tt.k); got != tt.want {
			t.Errorf("TokenTime(%d) = %v, want %v", tt.k, got, tt.want)
		}
		if tt.want != Never && a.TokensBy(tt.want) != tt.k {
			t.Errorf("TokensBy(%v) = %d, want %d", tt.want, a.TokensBy(tt.want), tt.k)
		}
	}
	hung := Attempt{Request: Request{OutputTokens: 3}, Outcome: OutcomeHang, FirstByte: Never, End: Never}
	if hung.TokenTime(1) != Never || hung.TokensBy(time.Hour) != 0 {
		t.Errorf("a hung attempt streams: token 1 at %v, %d tokens by 1h", hung.TokenTime(1), hung.TokensBy(time.Hour))
	}
}

func TestBilledTokensIncludeTheCancellationLag(t *testing.T) {
	ok := Attempt{
		Request:   Request{InputTokens: 500, OutputTokens: 100},
		Outcome:   OutcomeOK,
		FirstByte: time.Second,
		ITL:       10 * time.Millisecond,
		End:       2 * time.Second,
		cancelLag: 200 * time.Millisecond,
	}
	hang := ok
	hang.Outcome, hang.FirstByte, hang.ITL, hang.End = OutcomeHang, Never, 0, Never
	failed := ok
	failed.Outcome, failed.FirstByte, failed.ITL, failed.End = OutcomeServerError, Never, 0, 300*time.Millisecond
	limited := ok
	limited.Outcome, limited.FirstByte, limited.ITL, limited.End = OutcomeRateLimited, Never, 0, 50*time.Millisecond

	tests := []struct {
		name          string
		a             Attempt
		disconnect    time.Duration
		input, output int64
	}{
		{"disconnect well before first byte bills input only", ok, 500 * time.Millisecond, 500, 0},
		{"lag carries a disconnect just before first byte into the stream", ok, 850 * time.Millisecond, 500, 6},
		{"mid-stream disconnect bills 200 ms more tokens", ok, 1500 * time.Millisecond, 500, 71},
		{"lag is capped at the answer length", ok, 1900 * time.Millisecond, 500, 100},
		{"complete attempt bills the whole answer", ok, Never, 500, 100},
		{"hang bills input only", hang, 10 * time.Second, 500, 0},
		{"5xx bills input only", failed, Never, 500, 0},
		{"429 bills nothing", limited, Never, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := tt.a.BilledUsage(tt.disconnect)
			if u.InputUnits != tt.input || u.OutputUnits != tt.output {
				t.Errorf("BilledUsage(%v) = %d in, %d out; want %d, %d", tt.disconnect, u.InputUnits, u.OutputUnits, tt.input, tt.output)
			}
		})
	}
}

func TestAttemptRejectsArgumentsNoRunCanProduce(t *testing.T) {
	g := mustGenerator(t, mustModel(t, GPT4o), 1)
	p := mustProvider(t, g, 0, RateLimit{})
	good := g.Request(1)
	tests := []struct {
		name   string
		req    Request
		number int
		start  time.Duration
	}{
		{"negative start", good, 0, -time.Second},
		{"negative attempt number", good, -1, 0},
		{"zero output tokens", Request{ID: 1, InputTokens: 5}, 0, 0},
		{"negative input tokens", Request{ID: 1, InputTokens: -1, OutputTokens: 5}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := p.Attempt(tt.req, tt.number, tt.start); !errors.Is(err, ErrInvalidAttempt) {
				t.Errorf("err = %v, want ErrInvalidAttempt", err)
			}
		})
	}
}
