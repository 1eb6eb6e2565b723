// Package simulator compares hedge strategies on seeded workloads. Its
// discrete-event simulation drives the production engine (dispatcher/hedge),
// delay estimator and guardrail (dispatcher/delay), route picking
// (dispatcher/route), budgets (the memory store) and the arbiter's gate on
// virtual time: what it predicts is what those packages do live. Every group
// of every strategy is checked against the engine's invariants.
package simulator

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hedgerow/hedgerow/simulator/workload"
)

// Options selects one comparison.
type Options struct {
	Workload   string
	Requests   int
	Seed       uint64
	Stream     bool
	Strategies []string // empty: every strategy
	// Parallel bounds how many strategies run at once (0: one per strategy).
	Parallel int
	// Progress, when set, is told of finished groups in batches (the argument
	// is how many finished since the last call), from any goroutine.
	Progress func(groups int)
	// Records, when set, receives every group's sanitized records; it
	// needs exactly one strategy, whose groups they are.
	Records RecordSink
}

// Conditions are the pinned evaluation conditions, as reported.
type Conditions struct {
	Deadline           time.Duration `json:"-"`
	DeadlineMs         int64         `json:"deadline_ms"`
	ArrivalRate        float64       `json:"arrival_rate_per_s"`
	InputCostPerToken  float64       `json:"input_cost_per_token"`
	OutputCostPerToken float64       `json:"output_cost_per_token"`
	FailedCountAt      string        `json:"failed_groups_count_at"`
}

// Report is the outcome of one comparison; its JSON form is what
// `hedgerow simulate --json` prints.
type Report struct {
	Workload   string           `json:"workload"`
	Requests   int              `json:"requests"`
	Seed       uint64           `json:"seed"`
	Stream     bool             `json:"stream"`
	Conditions Conditions       `json:"conditions"`
	Strategies []StrategyResult `json:"strategies"`
}

// ErrInvalidOptions is wrapped by every error about the options themselves.
var ErrInvalidOptions = errors.New("invalid simulation options")

// Run simulates every selected strategy on the same seeded workload, each
// independently, and reports them in the order asked.
func Run(o Options) (*Report, error) {
	if o.Requests < 1 {
		return nil, fmt.Errorf("%w: requests must be at least 1, got %d", ErrInvalidOptions, o.Requests)
	}
	if _, err := workload.ByName(o.Workload); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	names := o.Strategies
	if len(names) == 0 {
		names = StrategyNames()
	}
	if o.Records != nil && len(names) != 1 {
		return nil, fmt.Errorf("%w: records need exactly one strategy, got %d", ErrInvalidOptions, len(names))
	}
	cond := workload.PinnedConditions()
	strategies := make([]strategy, len(names))
	for i, name := range names {
		s, err := newStrategy(name, cond)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
		}
		strategies[i] = s
	}
	results := make([]StrategyResult, len(strategies))
	err := inParallel(len(strategies), o.Parallel, func(i int) error {
		t, err := builtinTraffic(o, cond)
		var r *runner
		if err == nil {
			r, err = newRunner(strategies[i], t, o.Seed, newAccumulator(o.Requests))
		}
		if err == nil {
			r.records = o.Records
			results[i], err = r.run(o.Requests, o.Seed, o.Progress)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Report{
		Workload: o.Workload,
		Requests: o.Requests,
		Seed:     o.Seed,
		Stream:   o.Stream,
		Conditions: Conditions{
			Deadline:           cond.Deadline,
			DeadlineMs:         cond.Deadline.Milliseconds(),
			ArrivalRate:        cond.ArrivalRate,
			InputCostPerToken:  cond.InputCostPerToken,
			OutputCostPerToken: cond.OutputCostPerToken,
			FailedCountAt:      "deadline",
		},
		Strategies: results,
	}, nil
}

// inParallel runs run(0) … run(n-1), each on its own goroutine and at most
// parallel at a time (all n when parallel <= 0), and returns their errors
// joined in index order.
func inParallel(n, parallel int, run func(i int) error) error {
	if parallel <= 0 {
		parallel = n
	}
	errs := make([]error, n)
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = run(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
