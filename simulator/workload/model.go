package workload

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// Names of the built-in models, in the order ByName lists them.
const (
	// GPT4o is a gpt-4o-class route: fast first byte with a 2.3% stall mode.
	GPT4o = "gpt4o"
	// Sonnet is a Claude-Sonnet-class route: slower first byte, 4.5% stalls.
	Sonnet = "sonnet"
	// Mixed is gpt4o latencies with half the requests short-output (code
	// completion) and half conversational.
	Mixed = "mixed"
	// Degraded is gpt4o on three routes that each fall into correlated
	// degraded episodes (TTFT ×5, 10% errors).
	Degraded = "degraded"
	// Uneven is gpt4o whose route 0 stalls twice as often as its siblings
	// and decodes at half their speed, for the whole run.
	Uneven = "uneven"
	// Degrading is gpt4o whose route 0 turns into Uneven's degraded route
	// half-way through the run (ForRun; DegradingAt until told the run).
	Degrading = "degrading"
)

// ErrUnknownModel is returned by ByName for a name that is not a built-in model.
var ErrUnknownModel = errors.New("unknown workload model")

// Names returns the names ByName accepts.
func Names() []string { return []string{GPT4o, Sonnet, Mixed, Degraded, Uneven, Degrading} }

// LogNormal is the distribution of X where ln X ~ Normal(Mu, Sigma). Mu is
// in ln units of the quantity (seconds for latencies, tokens for counts), so
// exp(Mu) is the median.
type LogNormal struct {
	Mu    float64
	Sigma float64
}

// LogNormalMedian returns the lognormal with the given median and σ, the
// form in which published latency fits are usually quoted.
func LogNormalMedian(median, sigma float64) LogNormal {
	return LogNormal{Mu: math.Log(median), Sigma: sigma}
}

// Median returns exp(Mu).
func (d LogNormal) Median() float64 { return math.Exp(d.Mu) }

// at maps a standard normal draw z to the distribution.
func (d LogNormal) at(z float64) float64 { return math.Exp(d.Mu + d.Sigma*z) }

func (d LogNormal) validate(what string) error {
	if math.IsNaN(d.Mu) || math.IsInf(d.Mu, 0) {
		return fmt.Errorf("%s: mu %v is not finite", what, d.Mu)
	}
	if !(d.Sigma >= 0) || math.IsInf(d.Sigma, 0) {
		return fmt.Errorf("%s: sigma %v must be finite and ≥ 0", what, d.Sigma)
	}
	return nil
}

// TTFT is the time-to-first-byte mixture of one attempt that does not fail
// with a 5xx: with probability HangFraction no first byte ever arrives, with
// probability StallFraction the first byte is drawn from Stall, otherwise from
// Main. Latencies are in seconds.
type TTFT struct {
	Main          LogNormal
	Stall         LogNormal
	StallFraction float64
	HangFraction  float64
}

// Degradation makes each route an alternating renewal process (a two-state
// chain with uniform degraded durations): healthy for an exponential time,
// then degraded for a uniform time in [MinEpisode, MaxEpisode]. Episode starts
// are either private to a route or common shocks shared by every route that is
// healthy when the shock arrives (see schedule.go for the construction and why
// it keeps each route's own process exactly as specified).
type Degradation struct {
	// Routes is how many routes the model has.
	Routes int
	// MeanCycle is the mean time from one episode start to the next on a
	// route (healthy mean + episode mean).
	MeanCycle time.Duration
	// MinEpisode and MaxEpisode bound the uniform episode duration.
	MinEpisode, MaxEpisode time.Duration
	// CommonShare is the fraction of a healthy route's episode onsets that
	// come from the common-shock process. It is calibrated so that the
	// pairwise correlation of the degraded indicators is TargetCorrelation.
	CommonShare float64
	// TargetCorrelation documents the pairwise correlation CommonShare was
	// calibrated for; the tests measure it.
	TargetCorrelation float64
	// TTFTFactor multiplies the first-byte latency of an attempt that starts
	// while its route is degraded (the route's state at the attempt's start
	// decides; a hang stays a hang).
	TTFTFactor float64
	// ErrorFraction replaces Model.ErrorFraction while degraded.
	ErrorFraction float64
	// WarmUp is how long the chain runs before time 0 so that the schedule is
	// stationary from the first query.
	WarmUp time.Duration
}

// meanEpisode is the mean of the uniform episode duration.
func (d *Degradation) meanEpisode() time.Duration { return (d.MinEpisode + d.MaxEpisode) / 2 }

// StationaryFraction is the long-run fraction of time a route is degraded:
// mean episode / mean cycle (0.4 for the built-in model: 2 min of every 5).
func (d *Degradation) StationaryFraction() float64 {
	return d.meanEpisode().Seconds() / d.MeanCycle.Seconds()
}

func (d *Degradation) validate() error {
	switch {
	case d.Routes < 1:
		return fmt.Errorf("degradation: routes %d must be ≥ 1", d.Routes)
	case d.MinEpisode <= 0 || d.MaxEpisode < d.MinEpisode:
		return fmt.Errorf("degradation: episode bounds [%v, %v] must satisfy 0 < min ≤ max", d.MinEpisode, d.MaxEpisode)
	case d.MeanCycle <= d.meanEpisode():
		return fmt.Errorf("degradation: mean cycle %v must exceed the mean episode %v", d.MeanCycle, d.meanEpisode())
	case !(d.CommonShare >= 0 && d.CommonShare <= 1):
		return fmt.Errorf("degradation: common share %v must be in [0, 1]", d.CommonShare)
	case !(d.TTFTFactor > 0) || math.IsInf(d.TTFTFactor, 0):
		return fmt.Errorf("degradation: TTFT factor %v must be finite and > 0", d.TTFTFactor)
	case !(d.ErrorFraction >= 0 && d.ErrorFraction <= 1):
		return fmt.Errorf("degradation: error fraction %v must be in [0, 1]", d.ErrorFraction)
	case d.WarmUp < 0:
		return fmt.Errorf("degradation: warm-up %v must be ≥ 0", d.WarmUp)
	}
	return nil
}

// Model is the full parameter set of one workload. The built-in models come
// from ByName; the fields are exported so a simulation can state exactly what
// it ran and vary one parameter at a time. NewGenerator validates them.
type Model struct {
	// Name identifies the model in reports.
	Name string
	// TTFT is the first-byte mixture of attempts that do not fail with a 5xx.
	TTFT TTFT
	// TokensPerSecond is the median decode speed; the inter-token latency of
	// an attempt is lognormal with median 1/TokensPerSecond and σ ITLSigma.
	TokensPerSecond float64
	ITLSigma        float64
	// InputTokens and OutputTokens are the per-request token counts (Azure LLM
	// inference trace, conversation), drawn independently.
	InputTokens  LogNormal
	OutputTokens LogNormal
	// ShortFraction of requests draw their output from ShortOutputTokens
	// instead (the short-output half of `mixed`).
	ShortFraction     float64
	ShortOutputTokens LogNormal
	// MaxOutputTokens caps every output length.
	MaxOutputTokens int
	// ErrorFraction of attempts answer 5xx after a uniform delay in
	// [ErrorAfterMin, ErrorAfterMax].
	ErrorFraction                float64
	ErrorAfterMin, ErrorAfterMax time.Duration
	// RejectAfter is how long a rate-limited attempt takes to get its 429.
	RejectAfter time.Duration
	// CancelLag is how long a provider keeps generating (and billing) after
	// the client disconnects, in model time.
	CancelLag time.Duration
	// Degradation, when set, gives the routes correlated degraded episodes.
	Degradation *Degradation
	// Shift, when set, makes one route worse than its siblings (shift.go).
	Shift *RouteShift
	// Empirical, when set, replaces the TTFT mixture, the decode speed, the
	// token counts and the error fraction with distributions measured from
	// recorded traffic (see EmpiricalModel).
	Empirical *Empirical
}

// EmpiricalModel returns a model that draws from measured distributions:
// the gpt4o model's remaining parameters (cancellation lag, 429 delay)
// apply, and MaxOutputTokens is the longest measured answer.
func EmpiricalModel(name string, e *Empirical) (*Model, error) {
	if e == nil {
		return nil, fmt.Errorf("%w: nil", ErrEmptyEmpirical)
	}
	if err := e.validate(); err != nil {
		return nil, fmt.Errorf("workload model %q: %w", name, err)
	}
	m := baseModel(name)
	m.Empirical = e
	m.MaxOutputTokens = 1
	for _, tc := range e.Tokens {
		m.MaxOutputTokens = max(m.MaxOutputTokens, tc.Output)
	}
	return m, nil
}

// gpt4oTTFT and sonnetTTFT are the published first-byte fits of docs/architecture.md §11.
var (
	gpt4oTTFT = TTFT{
		Main:          LogNormalMedian(0.62, 0.33),
		Stall:         LogNormalMedian(3.5, 0.45),
		StallFraction: 0.023,
		HangFraction:  0.002,
	}
	sonnetTTFT = TTFT{
		Main:          LogNormalMedian(0.90, 0.45),
		Stall:         LogNormalMedian(3.6, 0.35),
		StallFraction: 0.045,
		HangFraction:  0.002,
	}
)

// calibratedCommonShare gives a pairwise correlation of the degraded
// indicators of 0.30 with the built-in episode parameters: measured 0.301
// over 20 seeds × 10^7 simulated seconds (0.40 gives 0.286, 0.43 gives
// 0.312). TestDegradedRoutesAreCorrelated checks it.
const calibratedCommonShare = 0.417

// baseModel is the conversational gpt4o-class model that the others vary.
func baseModel(name string) *Model {
	return &Model{
		Name:              name,
		TTFT:              gpt4oTTFT,
		TokensPerSecond:   130,
		ITLSigma:          0.12,
		InputTokens:       LogNormal{Mu: 6.63, Sigma: 0.99},
		OutputTokens:      LogNormal{Mu: 5.02, Sigma: 0.86},
		ShortOutputTokens: LogNormal{Mu: 2.79, Sigma: 0.85},
		MaxOutputTokens:   1000,
		ErrorFraction:     0.005,
		ErrorAfterMin:     200 * time.Millisecond,
		ErrorAfterMax:     500 * time.Millisecond,
		RejectAfter:       50 * time.Millisecond,
		CancelLag:         200 * time.Millisecond,
	}
}

// ByName returns a fresh copy of the built-in model with that name; the
// caller may change its fields without affecting other callers.
func ByName(name string) (*Model, error) {
	m := baseModel(name)
	switch name {
	case GPT4o:
	case Sonnet:
		m.TTFT = sonnetTTFT
		m.TokensPerSecond = 104
	case Mixed:
		m.ShortFraction = 0.5
	case Degraded:
		m.Degradation = &Degradation{
			Routes:            3,
			MeanCycle:         5 * time.Minute,
			MinEpisode:        1 * time.Minute,
			MaxEpisode:        3 * time.Minute,
			CommonShare:       calibratedCommonShare,
			TargetCorrelation: 0.3,
			TTFTFactor:        5,
			ErrorFraction:     0.10,
			WarmUp:            30 * time.Minute,
		}
	case Uneven:
		m.Shift = UnevenShift()
	case Degrading:
		m.Shift = UnevenShift()
		m.Shift.From, m.Shift.AtFraction = DegradingAt, 0.5
	default:
		return nil, fmt.Errorf("%w %q: valid names are %s", ErrUnknownModel, name, strings.Join(Names(), ", "))
	}
	return m, nil
}

func validFraction(f float64) bool { return f >= 0 && f <= 1 }

// Validate reports the first parameter that would make draws meaningless.
func (m *Model) Validate() error {
	if err := m.validate(); err != nil {
		return fmt.Errorf("workload model %q: %w", m.Name, err)
	}
	return nil
}

func (m *Model) validate() error {
	for _, d := range []struct {
		what string
		ln   LogNormal
	}{
		{"TTFT main", m.TTFT.Main},
		{"TTFT stall", m.TTFT.Stall},
		{"input tokens", m.InputTokens},
		{"output tokens", m.OutputTokens},
		{"short output tokens", m.ShortOutputTokens},
	} {
		if err := d.ln.validate(d.what); err != nil {
			return err
		}
	}
	switch {
	case !validFraction(m.TTFT.StallFraction) || !validFraction(m.TTFT.HangFraction) ||
		m.TTFT.StallFraction+m.TTFT.HangFraction > 1:
		return fmt.Errorf("TTFT stall %v and hang %v fractions must be in [0, 1] and sum to ≤ 1",
			m.TTFT.StallFraction, m.TTFT.HangFraction)
	case !(m.TokensPerSecond > 0) || math.IsInf(m.TokensPerSecond, 0):
		return fmt.Errorf("tokens per second %v must be finite and > 0", m.TokensPerSecond)
	case !(m.ITLSigma >= 0) || math.IsInf(m.ITLSigma, 0):
		return fmt.Errorf("ITL sigma %v must be finite and ≥ 0", m.ITLSigma)
	case !validFraction(m.ShortFraction):
		return fmt.Errorf("short fraction %v must be in [0, 1]", m.ShortFraction)
	case m.MaxOutputTokens < 1:
		return fmt.Errorf("max output tokens %d must be ≥ 1", m.MaxOutputTokens)
	case !validFraction(m.ErrorFraction):
		return fmt.Errorf("error fraction %v must be in [0, 1]", m.ErrorFraction)
	case m.ErrorAfterMin < 0 || m.ErrorAfterMax < m.ErrorAfterMin:
		return fmt.Errorf("error delay bounds [%v, %v] must satisfy 0 ≤ min ≤ max", m.ErrorAfterMin, m.ErrorAfterMax)
	case m.RejectAfter < 0:
		return fmt.Errorf("reject delay %v must be ≥ 0", m.RejectAfter)
	case m.CancelLag < 0:
		return fmt.Errorf("cancel lag %v must be ≥ 0", m.CancelLag)
	}
	if m.Empirical != nil {
		if err := m.Empirical.validate(); err != nil {
			return err
		}
	}
	if m.Shift != nil {
		if err := m.Shift.validate(m); err != nil {
			return err
		}
	}
	if m.Degradation != nil {
		return m.Degradation.validate()
	}
	return nil
}
