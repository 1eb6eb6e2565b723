package budgets

import (
	"math"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// EstimateCancelled returns the usage to settle a cancelled attempt with. A
// provider may keep generating, and billing, after the disconnect, so the
// reported output is only a lower bound: the attempt is settled at the larger of
// the reported output and decodeElapsed × tokensPerSecond (the cohort's decode
// rate), and flagged Estimated when the estimate is the larger. A non-positive
// or non-finite elapsed time or rate estimates nothing, leaving the report as is.
func EstimateCancelled(reported schemas.Usage, decodeElapsed time.Duration, tokensPerSecond float64) schemas.Usage {
	if decodeElapsed <= 0 || !(tokensPerSecond > 0) || math.IsInf(tokensPerSecond, 1) {
		return reported
	}
	// Round up, as a bill would, but forgive float noise so that 0.5 s at
	// 100 tokens/s is 50 tokens, not 51.
	est := math.Ceil(decodeElapsed.Seconds()*tokensPerSecond - 1e-9)
	if est > math.MaxInt64/2 {
		est = math.MaxInt64 / 2
	}
	if out := int64(est); out > reported.OutputUnits {
		reported.OutputUnits = out
		reported.Estimated = true
	}
	return reported
}
