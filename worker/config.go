package worker

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/worker/upstream"
)

// Defaults of the optional Options fields.
const (
	// DefaultMaxInflight bounds the attempts one worker runs at once.
	DefaultMaxInflight = 64
	// DefaultHeartbeatInterval is a fifth of the dispatcher's default
	// heartbeat timeout (1 s), so three lost heartbeats in a row still do
	// not trip it, and below the default accept timeout (250 ms).
	DefaultHeartbeatInterval = 200 * time.Millisecond
	// DefaultCoalesceTokens and DefaultCoalesceDelay bound a chunk: it is
	// sent once it holds this many tokens, or this long after its first
	// token, whichever comes first (docs/architecture.md §8).
	DefaultCoalesceTokens = 16
	DefaultCoalesceDelay  = 5 * time.Millisecond
	// DefaultDrainGrace is how long Stop lets in-flight attempts finish;
	// it leaves room within a typical 30 s termination grace period.
	DefaultDrainGrace = 20 * time.Second
)

// routePattern is the NATS-subject-safe token a route name must be (docs/architecture.md §8).
var routePattern = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)

// idPattern is the schema's opaque identifier, which a worker id must be to
// appear in Accept and records.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,128}$`)

// Options configures a Worker for one route.
type Options struct {
	// Route is the route this worker serves; it names the attempt subject
	// and queue group. Required.
	Route string
	// Region is the region of the supercluster the worker serves in
	// (config's deployment.region): its attempt subject, queue group,
	// service name and record subject are the region's (schemas.Wire), so
	// it takes no other region's attempts. Empty: a deployment of one
	// region, today's wire. It must be a token of [a-z0-9_-].
	Region string
	// Upstream runs attempts against the route's provider. Required. If it
	// also has a CloseIdleConnections method, Stop calls it.
	Upstream upstream.Upstream
	// Conn is the NATS connection; the worker does not close it. Required.
	Conn *nats.Conn
	// WorkerID names the worker in Accept, results and records; empty
	// generates "<route>-<random hex>".
	WorkerID string
	// MaxInflight is how many attempts the worker runs at once; an attempt
	// beyond it is answered Busy. 0 means DefaultMaxInflight.
	MaxInflight int
	// HeartbeatInterval is the period of heartbeats, from the Accept until
	// the result (after the first token a chunk stands for one). 0 means
	// DefaultHeartbeatInterval.
	HeartbeatInterval time.Duration
	// CoalesceTokens and CoalesceDelay bound a chunk (see the package
	// documentation). 0 means the defaults.
	CoalesceTokens int
	CoalesceDelay  time.Duration
	// DrainGrace is how long Stop waits for in-flight attempts before
	// cancelling them. 0 means DefaultDrainGrace.
	DrainGrace time.Duration
	// Now is the clock for elapsed times, deadlines and record times; nil
	// means time.Now. Timers (heartbeats, coalescing, the upstream
	// deadline) run on real time for the durations this clock measures.
	Now func() time.Time
	// Logger receives operational logs; nil discards them.
	Logger *slog.Logger
	// Metrics are the Prometheus collectors to count into; several workers
	// of one process share one (see NewMetrics). Nil counts into
	// collectors no registry sees.
	Metrics *Metrics
	// FingerprintKey is the deployment secret keying the prompt
	// fingerprint of records (schemas.PromptFingerprint); it must be the
	// dispatcher's for records to correlate. Empty uses a random key of
	// this worker, so fingerprints never leak an unkeyed hash.
	FingerprintKey []byte
	// Leases, when set, records each attempt in flight as a lease on the
	// route, so dispatchers see the cluster's load on it (see the package
	// documentation); nil records nothing. Store calls never delay an
	// attempt: a background goroutine of the worker makes them.
	Leases Leases
	// LeaseRenewInterval is how often leases are renewed; 0 means
	// DefaultLeaseRenewInterval.
	LeaseRenewInterval time.Duration
	// LeaseTTL is how long a lease lives without renewal, so a killed
	// worker's leases expire; at least twice LeaseRenewInterval. 0 means
	// DefaultLeaseRenewals renew intervals.
	LeaseTTL time.Duration
}

// withDefaults validates c and returns it with its defaults filled in.
func (c Options) withDefaults() (Options, error) {
	switch {
	case !routePattern.MatchString(c.Route):
		return c, fmt.Errorf("%w: route %q must match %s", ErrInvalidOptions, c.Route, routePattern)
	case c.Region != "" && !routePattern.MatchString(c.Region):
		return c, fmt.Errorf("%w: region %q must match %s", ErrInvalidOptions, c.Region, routePattern)
	case c.Upstream == nil:
		return c, fmt.Errorf("%w: route %q has no upstream", ErrInvalidOptions, c.Route)
	case c.Conn == nil:
		return c, fmt.Errorf("%w: route %q has no NATS connection", ErrInvalidOptions, c.Route)
	case c.MaxInflight < 0, c.HeartbeatInterval < 0, c.CoalesceTokens < 0, c.CoalesceDelay < 0, c.DrainGrace < 0,
		c.LeaseRenewInterval < 0, c.LeaseTTL < 0:
		return c, fmt.Errorf("%w: route %q: limits and intervals must not be negative", ErrInvalidOptions, c.Route)
	}
	if c.WorkerID == "" {
		var b [6]byte
		if _, err := rand.Read(b[:]); err != nil {
			return c, fmt.Errorf("worker: generate worker id: %w", err)
		}
		c.WorkerID = c.Route + "-" + hex.EncodeToString(b[:])
	}
	if !idPattern.MatchString(c.WorkerID) {
		return c, fmt.Errorf("%w: worker id %q must match %s", ErrInvalidOptions, c.WorkerID, idPattern)
	}
	c.MaxInflight = cmp.Or(c.MaxInflight, DefaultMaxInflight)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, DefaultHeartbeatInterval)
	c.CoalesceTokens = cmp.Or(c.CoalesceTokens, DefaultCoalesceTokens)
	c.CoalesceDelay = cmp.Or(c.CoalesceDelay, DefaultCoalesceDelay)
	c.DrainGrace = cmp.Or(c.DrainGrace, DefaultDrainGrace)
	c.LeaseRenewInterval = cmp.Or(c.LeaseRenewInterval, DefaultLeaseRenewInterval)
	c.LeaseTTL = cmp.Or(c.LeaseTTL, DefaultLeaseRenewals*c.LeaseRenewInterval)
	if c.LeaseTTL < 2*c.LeaseRenewInterval {
		return c, fmt.Errorf("%w: route %q: lease ttl %v is shorter than two renew intervals (%v): a late renewal would drop a live lease",
			ErrInvalidOptions, c.Route, c.LeaseTTL, c.LeaseRenewInterval)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics()
	}
	if len(c.FingerprintKey) == 0 {
		c.FingerprintKey = make([]byte, 32)
		if _, err := rand.Read(c.FingerprintKey); err != nil {
			return c, fmt.Errorf("worker: generate fingerprint key: %w", err)
		}
	}
	return c, nil
}
