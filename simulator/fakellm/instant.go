package fakellm

import (
	"fmt"
	"math"

	"github.com/hedgerow/hedgerow/simulator/workload"
)

// InstantName is the name of the model InstantModel returns.
const InstantName = "instant"

// InstantModel is a route with no latency of its own, for measuring what
// lies in front of it (`hedgerow bench --compare-direct`): every answer is
// exactly outputTokens long (fewer only when max_tokens says so), its first
// byte and every token are due at once, and nothing fails, stalls or hangs.
func InstantModel(outputTokens int) (*workload.Model, error) {
	if outputTokens < 1 {
		return nil, fmt.Errorf("%w: instant model: output tokens %d must be ≥ 1", ErrInvalidOptions, outputTokens)
	}
	// A lognormal needs a positive median: a picosecond rounds to a wait of
	// zero, and a spread of zero makes every draw the median.
	const now = 1e-12
	m, err := workload.ByName(workload.GPT4o)
	if err != nil {
		return nil, fmt.Errorf("instant model: %w", err)
	}
	m.Name = InstantName
	m.TTFT = workload.TTFT{Main: workload.LogNormalMedian(now, 0), Stall: workload.LogNormalMedian(now, 0)}
	m.TokensPerSecond, m.ITLSigma = 1/now, 0
	m.InputTokens = workload.LogNormal{Mu: math.Log(16)}
	m.OutputTokens = workload.LogNormal{Mu: math.Log(float64(outputTokens))}
	m.ShortFraction = 0
	m.MaxOutputTokens = outputTokens
	m.ErrorFraction, m.ErrorAfterMin, m.ErrorAfterMax = 0, 0, 0
	m.RejectAfter, m.CancelLag = 0, 0
	m.Degradation = nil
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("instant model: %w", err)
	}
	return m, nil
}
