// Package frontdoortest provides a scripted frontdoor.Submitter, so door
// tests check statuses, parsing and stream shapes without a NATS cluster,
// workers or providers behind the door.
package frontdoortest

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/dispatcher"
)

// Script answers one submission as the runtime would: a response, or an
// error of the kinds dispatcher.Submit returns.
type Script func(ctx context.Context, sub dispatcher.Submission, sink dispatcher.Sink) (*dispatcher.Response, error)

// Submitter is a scripted frontdoor.Submitter. It knows the pools and
// operation classes it is given, checks response formats with the arbiter's
// own contract code, runs Script for every submission and records each
// submission it was handed.
type Submitter struct {
	PoolNames []string
	// Aliases are the model names the pools answer to besides their own,
	// alias → pool, as dispatcher.Pool.Models configures them.
	Aliases    map[string]string
	Operations []string
	Script     Script
	// MaxOutputTokens is every pool's MaxTokens; zero means
	// dispatcher.DefaultMaxTokens.
	MaxOutputTokens int

	mu     sync.Mutex
	subs   []dispatcher.Submission
	groups int
}

// NewGroupID returns test-1, test-2, …
func (s *Submitter) NewGroupID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.groups++
	return "test-" + strconv.Itoa(s.groups)
}

// New returns a Submitter of the pool "general" and the operation class
// "default" that runs script.
func New(script Script) *Submitter {
	return &Submitter{PoolNames: []string{"general"}, Operations: []string{"default"}, Script: script}
}

// Submit records sub and runs the script; an unknown model is refused as
// the dispatcher refuses it. The script sees the model name the door sent.
func (s *Submitter) Submit(ctx context.Context, sub dispatcher.Submission, sink dispatcher.Sink) (*dispatcher.Response, error) {
	s.mu.Lock()
	s.subs = append(s.subs, sub)
	s.mu.Unlock()
	if _, ok := s.resolve(sub.Pool); !ok {
		return nil, fmt.Errorf("%w: %q", dispatcher.ErrUnknownPool, sub.Pool)
	}
	if s.Script == nil {
		return nil, fmt.Errorf("frontdoortest: no script for pool %q", sub.Pool)
	}
	return s.Script(ctx, sub, sink)
}

// Pools lists PoolNames.
func (s *Submitter) Pools() []string { return slices.Clone(s.PoolNames) }

// Models lists the pools in name order, each followed by its aliases in
// name order, as the dispatcher lists them.
func (s *Submitter) Models() []dispatcher.Model {
	var out []dispatcher.Model
	for _, pool := range slices.Sorted(slices.Values(s.PoolNames)) {
		out = append(out, dispatcher.Model{Name: pool, Pool: pool})
		for _, alias := range slices.Sorted(maps.Keys(s.Aliases)) {
			if s.Aliases[alias] == pool {
				out = append(out, dispatcher.Model{Name: alias, Pool: pool})
			}
		}
	}
	return out
}

// resolve is the pool a model name names: a pool's own name or an alias.
func (s *Submitter) resolve(model string) (string, bool) {
	if slices.Contains(s.PoolNames, model) {
		return model, true
	}
	pool, ok := s.Aliases[model]
	return pool, ok && slices.Contains(s.PoolNames, pool)
}

// HasOperation reports whether class is one of Operations.
func (s *Submitter) HasOperation(class string) bool { return slices.Contains(s.Operations, class) }

// MaxTokens is MaxOutputTokens (dispatcher.DefaultMaxTokens when zero) for
// a known model, 0 for another.
func (s *Submitter) MaxTokens(model string) int {
	if _, ok := s.resolve(model); !ok {
		return 0
	}
	if s.MaxOutputTokens > 0 {
		return s.MaxOutputTokens
	}
	return dispatcher.DefaultMaxTokens
}

// CheckResponseFormat judges a response_format against an empty pool
// contract with the arbiter, as the dispatcher does, the compile bounded by
// ctx and the arbiter's default budgets.
func (s *Submitter) CheckResponseFormat(ctx context.Context, tenant, model string, responseFormat json.RawMessage) error {
	if _, ok := s.resolve(model); !ok {
		return fmt.Errorf("%w: %q", dispatcher.ErrUnknownPool, model)
	}
	spec, changed, err := arbiter.ContractSpec{}.WithResponseFormat(responseFormat)
	if err != nil {
		return fmt.Errorf("%w: %w", dispatcher.ErrBadRequest, err)
	}
	if changed {
		if _, err := arbiter.NewSchemaCache(arbiter.SchemaCacheLimits{MaxEntries: 1}).Contract(ctx, tenant, spec); err != nil {
			return fmt.Errorf("%w: response_format: %w", dispatcher.ErrBadRequest, err)
		}
	}
	return nil
}

// Submissions returns what the door submitted so far.
func (s *Submitter) Submissions() []dispatcher.Submission {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.subs)
}

// Answer is a script that commits resp: a streaming submission first hears
// of the commit (when its sink asks, and commitFirst is set), then gets
// deltas in order.
func Answer(resp *dispatcher.Response, commitFirst bool, deltas ...dispatcher.Delta) Script {
	return func(ctx context.Context, sub dispatcher.Submission, sink dispatcher.Sink) (*dispatcher.Response, error) {
		if sink == nil {
			return resp, nil
		}
		if cs, ok := sink.(dispatcher.CommitSink); ok && commitFirst {
			cs.Committed(resp)
		}
		for _, d := range deltas {
			if err := sink.Delta(d); err != nil {
				return nil, fmt.Errorf("caller gone: %w", context.Canceled)
			}
		}
		return resp, nil
	}
}

// Fail is a script that fails every submission with err, after sending
// deltas to a streaming one (a failure after the commit).
func Fail(err error, deltas ...dispatcher.Delta) Script {
	return func(ctx context.Context, sub dispatcher.Submission, sink dispatcher.Sink) (*dispatcher.Response, error) {
		if sink != nil {
			for _, d := range deltas {
				if err := sink.Delta(d); err != nil {
					return nil, fmt.Errorf("caller gone: %w", context.Canceled)
				}
			}
		}
		return nil, err
	}
}

// Hold is a script that sends deltas, then holds the submission until its
// caller goes away, and reports that on gone.
func Hold(gone chan<- struct{}, deltas ...dispatcher.Delta) Script {
	return func(ctx context.Context, sub dispatcher.Submission, sink dispatcher.Sink) (*dispatcher.Response, error) {
		if sink != nil {
			for _, d := range deltas {
				if err := sink.Delta(d); err != nil {
					break
				}
			}
		}
		<-ctx.Done()
		gone <- struct{}{}
		return nil, ctx.Err()
	}
}
