package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// The pinned evaluation conditions of docs/architecture.md §11: every strategy comparison
// runs under them, so results are comparable across runs and with the
// reference simulation.
const (
	// PinnedDeadline is the absolute deadline of a user action; a failed
	// group counts in the latency percentiles at this value.
	PinnedDeadline = 30 * time.Second
	// PinnedArrivalRate is the Poisson arrival rate, in requests per second.
	PinnedArrivalRate = 50.0
	// PinnedInputCostPerToken and PinnedOutputCostPerToken are the cost
	// weights (the list-price ratio 1:4).
	PinnedInputCostPerToken  = 1.0
	PinnedOutputCostPerToken = 4.0
)

// Conditions are the evaluation conditions of a run.
type Conditions struct {
	// Deadline is the absolute deadline of a user action.
	Deadline time.Duration
	// ArrivalRate is the mean of the Poisson arrival process, per second.
	ArrivalRate float64
	// InputCostPerToken and OutputCostPerToken weigh billed usage into cost.
	InputCostPerToken  float64
	OutputCostPerToken float64
}

// PinnedConditions returns the conditions every comparison must use.
func PinnedConditions() Conditions {
	return Conditions{
		Deadline:           PinnedDeadline,
		ArrivalRate:        PinnedArrivalRate,
		InputCostPerToken:  PinnedInputCostPerToken,
		OutputCostPerToken: PinnedOutputCostPerToken,
	}
}

// Cost weighs billed usage: input × InputCostPerToken + output ×
// OutputCostPerToken.
func (c Conditions) Cost(u schemas.Usage) float64 {
	return float64(u.InputUnits)*c.InputCostPerToken + float64(u.OutputUnits)*c.OutputCostPerToken
}

// LatencyAtDeadline returns the latency a group counts with in the
// percentiles: its own when it succeeded within the deadline, the deadline
// when it failed or ran past it.
func (c Conditions) LatencyAtDeadline(latency time.Duration, failed bool) time.Duration {
	if failed || latency > c.Deadline {
		return c.Deadline
	}
	return latency
}

// Arrival is one request arrival: its request id and model time.
type Arrival struct {
	ID uint64
	At time.Duration
}

// Arrivals is a seeded Poisson arrival process. It is not safe for
// concurrent use; a run has one.
type Arrivals struct {
	rand   *rand.Rand
	rate   float64
	now    float64 // seconds
	nextID uint64
}

// NewArrivals returns a Poisson process of the given rate (per second) whose
// arrivals are a pure function of the seed. Request ids count up from 0.
func NewArrivals(rate float64, seed uint64) (*Arrivals, error) {
	if !(rate > 0) || math.IsInf(rate, 0) {
		return nil, fmt.Errorf("arrival rate %v per second must be finite and > 0", rate)
	}
	return &Arrivals{rand: newRand(seed, domainArrivals), rate: rate}, nil
}

// Next returns the next arrival; arrival times increase strictly.
func (a *Arrivals) Next() Arrival {
	a.now += a.rand.ExpFloat64() / a.rate
	arr := Arrival{ID: a.nextID, At: durationOf(a.now)}
	a.nextID++
	return arr
}
