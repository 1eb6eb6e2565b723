package sketchshare

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher/delay"
)

// Estimator is what a Syncer needs of a delay estimator; *delay.Estimator
// implements it.
type Estimator interface {
	// Cohorts lists the cohorts the estimator has seen.
	Cohorts() []delay.Cohort
	// Snapshot returns this replica's own samples of a cohort.
	Snapshot(c delay.Cohort, now time.Time) []delay.SlotSnapshot
	// Merge replaces the peer samples of a cohort with snaps.
	Merge(c delay.Cohort, now time.Time, snaps []delay.SlotSnapshot) error
}

var _ Estimator = (*delay.Estimator)(nil)

// DefaultInterval is how often Run syncs when SyncerOptions.Interval is zero.
const DefaultInterval = time.Second

// SyncerOptions configures a Syncer.
type SyncerOptions struct {
	// Interval between syncs in Run; zero means DefaultInterval.
	Interval time.Duration
	// Timeout bounds one sync's round trip; zero means Interval. It acts
	// through the context, which go-redis honours on reads only when the
	// client sets ContextTimeoutEnabled.
	Timeout time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger receives sync failures and recoveries; nil discards them.
	Logger *slog.Logger
	// AfterSync, if set, is called by Run after each sync with its error,
	// e.g. to feed metrics.
	AfterSync func(error)
}

// Stats counts what a Syncer did since it was made.
type Stats struct {
	// Rounds is the number of syncs that reached Redis.
	Rounds uint64
	// Failures is the number of syncs that did not, wholly or in part.
	Failures uint64
	// CorruptPeerData is the number of peer fields, snapshots and index
	// entries ignored as undecodable or unmergeable.
	CorruptPeerData uint64
}

// Syncer keeps the estimators of every operation class in step with the
// other replicas through an Exchange.
type Syncer struct {
	x          *Exchange
	estimators []namedEstimator
	cfg        SyncerOptions

	rounds, failures, corrupt atomic.Uint64

	mu          sync.Mutex // serialises syncs; guards the fields below
	indexed     map[string][]delay.Cohort
	failing     bool
	lastCorrupt int
}

type namedEstimator struct {
	class string
	est   Estimator
}

// NewSyncer returns a Syncer for estimators, keyed by operation class name.
// The classes are fixed: each names its own keys.
func NewSyncer(x *Exchange, estimators map[string]Estimator, cfg SyncerOptions) (*Syncer, error) {
	if x == nil {
		return nil, errors.New("sketchshare: an exchange is required")
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Interval < 0 {
		return nil, fmt.Errorf("sketchshare: interval %v must be positive", cfg.Interval)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = cfg.Interval
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("sketchshare: timeout %v must be positive", cfg.Timeout)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Syncer{x: x, cfg: cfg, indexed: map[string][]delay.Cohort{}}
	for class, est := range estimators {
		if class == "" || est == nil {
			return nil, fmt.Errorf("sketchshare: class %q needs a name and an estimator", class)
		}
		s.estimators = append(s.estimators, namedEstimator{class: class, est: est})
	}
	sort.Slice(s.estimators, func(i, j int) bool { return s.estimators[i].class < s.estimators[j].class })
	return s, nil
}

// Stats returns the syncer's counters.
func (s *Syncer) Stats() Stats {
	return Stats{Rounds: s.rounds.Load(), Failures: s.failures.Load(), CorruptPeerData: s.corrupt.Load()}
}

// Run syncs at once and then every Interval until ctx ends. Failures are
// logged and counted, never fatal: the estimators keep their own samples
// and the next sync tries again.
func (s *Syncer) Run(ctx context.Context) {
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	for {
		tctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
		err := s.SyncOnce(tctx)
		cancel()
		if s.cfg.AfterSync != nil {
			s.cfg.AfterSync(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if ctx.Err() != nil { // both were ready
				return
			}
		}
	}
}

// SyncOnce publishes every estimator's own snapshots, fetches the other
// replicas' in one round trip and merges them. A cohort only another
// replica has served is learnt from the index in one sync and fetched from
// the next. The error joins what went wrong — Redis unreachable, a failed
// command, corrupt peer data (ErrCorruptPeerData) — and every part of the
// round that succeeded is merged regardless.
func (s *Syncer) SyncOnce(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()

	classes := make([]string, 0, len(s.estimators))
	var pubs []Publication
	var owners []Estimator // owners[i] merges pubs[i]
	for _, ne := range s.estimators {
		classes = append(classes, ne.class)
		seen := map[delay.Cohort]bool{}
		for _, c := range ne.est.Cohorts() {
			seen[c] = true
			pubs = append(pubs, Publication{Class: ne.class, Cohort: c, Snapshots: ne.est.Snapshot(c, now)})
			owners = append(owners, ne.est)
		}
		for _, c := range s.indexed[ne.class] {
			if !seen[c] {
				pubs = append(pubs, Publication{Class: ne.class, Cohort: c})
				owners = append(owners, ne.est)
			}
		}
	}

	round, err := s.x.Exchange(ctx, now, classes, pubs)
	errs := []error{}
	if err != nil {
		errs = append(errs, err)
	}
	if round.Cohorts != nil {
		s.rounds.Add(1)
	}
	corrupt := round.Corrupt
	for i, cp := range round.Cohorts {
		if cp.Err != nil {
			continue // keep the peers of the last good round
		}
		corrupt = append(corrupt, mergePeers(owners[i], cp, now)...)
	}
	for class, cohorts := range round.Indexed {
		s.indexed[class] = cohorts
	}
	if len(corrupt) > 0 {
		s.corrupt.Add(uint64(len(corrupt)))
		errs = append(errs, corrupt...)
	}
	if err != nil {
		s.failures.Add(1)
	}
	s.logTransition(err, len(corrupt))
	return errors.Join(errs...)
}

// mergePeers merges every peer's snapshots of a cohort. Merge refuses a set
// as a whole, so when it does, each peer is tried alone and only the peers
// it refuses are left out: one bad replica cannot stop the others' samples
// from being shared.
func mergePeers(est Estimator, cp CohortPeers, now time.Time) []error {
	var all []delay.SlotSnapshot
	for _, p := range cp.Peers {
		all = append(all, p.Snapshots...)
	}
	if est.Merge(cp.Cohort, now, all) == nil {
		return nil
	}
	var good []delay.SlotSnapshot
	var errs []error
	for _, p := range cp.Peers {
		if err := est.Merge(cp.Cohort, now, p.Snapshots); err != nil {
			errs = append(errs, fmt.Errorf("%w: %s %s from replica %q: %w", ErrCorruptPeerData, cp.Class, cp.Cohort, p.Replica, err))
			continue
		}
		good = append(good, p.Snapshots...)
	}
	if err := est.Merge(cp.Cohort, now, good); err != nil {
		errs = append(errs, fmt.Errorf("%w: %s %s: %w", ErrCorruptPeerData, cp.Class, cp.Cohort, err))
	}
	return errs
}

// logTransition logs when sharing starts failing and when it recovers, not
// on every sync of an outage; the counters carry the rest. Corrupt peer
// data is logged when the amount of it changes.
func (s *Syncer) logTransition(err error, corrupt int) {
	switch {
	case err != nil && !s.failing:
		s.failing = true
		s.cfg.Logger.Warn("latency sketch sharing failed; using this replica's samples", "replica", s.x.ReplicaID(), "err", err)
	case err == nil && s.failing:
		s.failing = false
		s.cfg.Logger.Info("latency sketch sharing recovered", "replica", s.x.ReplicaID())
	}
	if corrupt > 0 && corrupt != s.lastCorrupt {
		s.cfg.Logger.Warn("ignored corrupt peer latency data", "replica", s.x.ReplicaID(), "count", corrupt)
	}
	s.lastCorrupt = corrupt
}
