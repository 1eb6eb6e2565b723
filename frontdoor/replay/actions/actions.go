// Package actions is the index of committed user actions across regions
// (docs/architecture.md §14, "User actions across regions"): the winner
// gate and the replay store stay in their region, and this index tells
// every other region which user actions a region committed, so a retry
// that reaches another region is not run again blindly.
//
// Each region publishes an entry per committed user action into its own
// JetStream stream, hedgerow_actions_<region> (subjects
// hedgerow.<region>.actions.>, placed in the region's cluster, the last
// entry of each key kept for the replay TTL): the replay key (a hash of the
// tenant and the caller's key), the request's fingerprint (a hash), the
// region and the commit time, and — only with Options.ReplicateAnswers —
// the answer itself. It also publishes a heartbeat there every second.
// Each region keeps hedgerow_actions_seen_<region>, placed in its own
// cluster, sourcing the other regions' streams: JetStream copies their
// entries over the supercluster's gateway links in the background and
// resumes after a cut. A lookup reads that local copy (a direct get of the
// key's last entry), so nothing on a request's path waits on another
// region; a region is unheard once its last heartbeat (or entry) arrived
// here longer than Options.RerunAfter ago.
//
// Index implements replay.Elsewhere. Entries hold hashes, a region name, a
// time and, when opted in, the answer: nothing is logged of them.
package actions

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/frontdoor/replay"
	"github.com/hedgerow/hedgerow/schemas"
)

// Stream names before the region is appended (schemas.Wire.JetStreamName):
// a region's own entries, and its copy of every other region's.
const (
	StreamName     = "hedgerow_actions"
	SeenStreamName = "hedgerow_actions_seen"
)

// Defaults of Options.
const (
	DefaultRerunAfter = 30 * time.Second
	DefaultHeartbeat  = time.Second
	// DefaultPending bounds the entries waiting to be published; one more
	// is dropped (counted), never waited for.
	DefaultPending = 4096
)

// maxQueuedBytes bounds the bytes of the entries waiting to be published,
// whatever their count: with answers an entry may be megabytes, and
// waiting entries are the gateway's memory.
const maxQueuedBytes = 64 << 20

// Timeouts of the index's own calls, all in the region.
const (
	publishTimeout = 2 * time.Second
	// lookupTimeout bounds a lookup on a request's path: the region's own
	// servers answer a direct get in well under a millisecond, or at once
	// that nobody serves the copy; a server that hangs costs no more.
	lookupTimeout  = 500 * time.Millisecond
	ensureTimeout  = 5 * time.Second
	maxEnsurePause = 30 * time.Second
)

// entryOverhead is room left in a NATS message for an entry's fields, its
// headers and the JetStream publish beside the answer; an answer that does
// not fit is not carried (the entry still is).
const entryOverhead = 4 << 10

// ErrBadKey: a key that is not a replay key (lower-case hex), which a
// subject could not carry safely.
var ErrBadKey = errors.New("actions: not a replay key")

var replayKey = regexp.MustCompile(`^[0-9a-f]{1,128}$`)

// Options configure an Index.
type Options struct {
	// Region is this region (deployment.region); Regions every region
	// (global.regions), Region among them. Only the others are sourced.
	Region  string
	Regions []string
	// ReplicateAnswers carries the committed answers in the entries
	// (global.replicate_answers); false carries none (data residency).
	ReplicateAnswers bool
	// RerunAfter is how long a region must be unheard before a user
	// action it committed, whose answer is not here, runs again here;
	// zero means DefaultRerunAfter.
	RerunAfter time.Duration
	// MaxAge is how long entries are kept (the replay TTL); zero means
	// replay.DefaultTTL. MaxBytes bounds the region's stream, and the copy
	// holds as much for each other region (zero:
	// replay.DefaultMaxTotalBytes); past it the oldest entries go.
	MaxAge   time.Duration
	MaxBytes int64
	// Replicas of each stream in its region's cluster; zero means 1.
	Replicas int
	// Heartbeat is how often the region says it is alive; zero means
	// DefaultHeartbeat.
	Heartbeat time.Duration
	// Pending bounds the entries waiting to be published; zero means
	// DefaultPending.
	Pending int
	// Now is the clock a region's last arrival is judged against; nil
	// means time.Now. The arrivals are stamped by the region's NATS
	// servers, whose clocks must agree with the gateways'.
	Now        func() time.Time
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Index is a gateway's side of the index: it publishes the region's
// entries and heartbeats, and looks keys up in the region's copy of the
// others'. It implements replay.Elsewhere. Close stops it.
type Index struct {
	opts      Options
	nc        *nats.Conn
	js        jetstream.JetStream
	wire      schemas.Wire
	stream    string // the region's own entries
	seen      string // the region's copy of the others'
	ready     chan struct{}
	pending   chan pending
	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	draining  context.Context // Close's: the queued entries are published within it
	// halt ends the background work's calls to NATS when Close's context
	// ends before they do (a region started cut off from the meta leader
	// may be creating its streams): Close never outlasts its context by a
	// call's timeout.
	halt        context.Context
	cancelHalt  context.CancelFunc
	published   *prometheus.CounterVec
	lookups     *prometheus.CounterVec
	queued      atomic.Int64 // bytes of the entries waiting in pending
	reruns      *prometheus.CounterVec
	lookupError sync.Once
}

// pending is an entry waiting to be published.
type pending struct {
	key   string
	entry []byte
}

// entry is what the index holds of one committed user action.
type entry struct {
	Region      string    `json:"region"`
	Fingerprint string    `json:"fingerprint"`
	Committed   time.Time `json:"committed"`
	Answer      *answer   `json:"answer,omitempty"`
}

// answer is a replay.Answer in an entry.
type answer struct {
	Status  int               `json:"status,omitempty"`
	Header  map[string]string `json:"header,omitempty"`
	Body    []byte            `json:"body,omitempty"`
	NotKept bool              `json:"not_kept,omitempty"`
}

// New starts the region's index on nc: it creates or updates the region's
// two streams in the background, retrying until it can (creating a stream
// needs the supercluster's JetStream meta leader, which may be across a cut
// link: the gateway serves meanwhile, looking nothing up and counting its
// entries as failed), and heartbeats.
func New(nc *nats.Conn, opts Options) (*Index, error) {
	if nc == nil {
		return nil, errors.New("actions: a NATS connection is required")
	}
	if opts.Region == "" || !slices.Contains(opts.Regions, opts.Region) {
		return nil, fmt.Errorf("actions: region %q is not one of the regions %v", opts.Region, opts.Regions)
	}
	if opts.RerunAfter < 0 || opts.MaxAge < 0 || opts.MaxBytes < 0 || opts.Replicas < 0 || opts.Heartbeat < 0 || opts.Pending < 0 {
		return nil, errors.New("actions: negative options")
	}
	opts.RerunAfter = cmp.Or(opts.RerunAfter, DefaultRerunAfter)
	opts.MaxAge = cmp.Or(opts.MaxAge, replay.DefaultTTL)
	opts.MaxBytes = cmp.Or(opts.MaxBytes, replay.DefaultMaxTotalBytes)
	opts.Replicas = cmp.Or(opts.Replicas, 1)
	opts.Heartbeat = cmp.Or(opts.Heartbeat, DefaultHeartbeat)
	opts.Pending = cmp.Or(opts.Pending, DefaultPending)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("actions: %w", err)
	}
	w := schemas.RegionWire(opts.Region)
	x := &Index{opts: opts, nc: nc, js: js, wire: w,
		stream: w.JetStreamName(StreamName), seen: w.JetStreamName(SeenStreamName),
		ready: make(chan struct{}), pending: make(chan pending, opts.Pending), stop: make(chan struct{}),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hedgerow_cross_region_index_published_total",
			Help: "Entries of committed user actions this gateway published to its region's index, by result (ok, error, dropped: the queue was full).",
		}, []string{"result"}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hedgerow_cross_region_lookups_total",
			Help: "Lookups of a user action in the region's copy of the other regions' index, by result (found, none, error: unreadable or malformed — such a request runs as if no other region committed it).",
		}, []string{"result"}),
		reruns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hedgerow_cross_region_reruns_total",
			Help: "User actions committed in another region run again here, that region unheard for longer than global.rerun_after, by the region that committed them.",
		}, []string{"region"}),
	}
	x.halt, x.cancelHalt = context.WithCancel(context.Background())
	for _, r := range []string{"ok", "error", "dropped"} {
		x.published.WithLabelValues(r)
	}
	for _, r := range []string{"found", "none", "error"} {
		x.lookups.WithLabelValues(r)
	}
	for _, r := range opts.Regions {
		if r != opts.Region {
			x.reruns.WithLabelValues(r)
		}
	}
	if reg := opts.Registerer; reg != nil {
		for _, c := range []prometheus.Collector{x.published, x.lookups, x.reruns} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("actions: register metrics: %w", err)
			}
		}
	}
	x.wg.Go(x.ensure)
	x.wg.Go(x.publish)
	x.wg.Go(x.heartbeat)
	return x, nil
}

// StreamConfig is the region's own stream: its entries and heartbeats, the
// last of each subject, in the region's cluster.
func (x *Index) StreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        x.stream,
		Description: "hedgerow: the region's committed user actions, for the other regions (docs/architecture.md §14)",
		Subjects:    []string{x.wire.ActionPrefix() + ">"},
		Storage:     jetstream.FileStorage, Retention: jetstream.LimitsPolicy, Discard: jetstream.DiscardOld,
		MaxMsgsPerSubject: 1, MaxAge: x.opts.MaxAge, MaxBytes: x.opts.MaxBytes, Replicas: x.opts.Replicas,
		Placement: &jetstream.Placement{Cluster: x.opts.Region},
	}
}

// SeenStreamConfig is the region's copy of the other regions' streams,
// sourced, in the region's cluster, read by direct gets.
func (x *Index) SeenStreamConfig() jetstream.StreamConfig {
	c := jetstream.StreamConfig{
		Name:        x.seen,
		Description: "hedgerow: the other regions' committed user actions, sourced (docs/architecture.md §14)",
		Storage:     jetstream.FileStorage, Retention: jetstream.LimitsPolicy, Discard: jetstream.DiscardOld,
		MaxMsgsPerSubject: 1, MaxAge: x.opts.MaxAge, MaxBytes: x.opts.MaxBytes * int64(max(1, len(x.opts.Regions)-1)), Replicas: x.opts.Replicas,
		Placement: &jetstream.Placement{Cluster: x.opts.Region}, AllowDirect: true,
	}
	for _, r := range x.opts.Regions {
		if r != x.opts.Region {
			c.Sources = append(c.Sources, &jetstream.StreamSource{Name: schemas.RegionWire(r).JetStreamName(StreamName)})
		}
	}
	return c
}

// Ready is closed once the region's streams exist.
func (x *Index) Ready() <-chan struct{} { return x.ready }

// ensure creates or updates the two streams, again with backoff until
// both are there.
func (x *Index) ensure() {
	pause := time.Second
	for {
		ctx, cancel := context.WithTimeout(x.halt, ensureTimeout)
		_, err := x.js.CreateOrUpdateStream(ctx, x.StreamConfig())
		if err == nil {
			_, err = x.js.CreateOrUpdateStream(ctx, x.SeenStreamConfig())
		}
		cancel()
		if err == nil {
			close(x.ready)
			return
		}
		x.opts.Logger.Warn("cross-region index streams not created yet: retrying", "stream", x.stream, "err", err)
		t := time.NewTimer(pause)
		select {
		case <-x.stop:
			t.Stop()
			return
		case <-t.C:
		}
		pause = min(2*pause, maxEnsurePause)
	}
}

// Publish implements replay.Elsewhere: the entry of key is queued for the
// publisher, never waited for; a full queue drops it (counted).
func (x *Index) Publish(key string, a *replay.Answer) {
	if a == nil || !replayKey.MatchString(key) {
		return
	}
	e := entry{Region: x.opts.Region, Fingerprint: a.Fingerprint, Committed: x.opts.Now().UTC()}
	if x.opts.ReplicateAnswers {
		e.Answer = &answer{Status: a.Status, Header: a.Header, Body: a.Body, NotKept: a.NotKept}
	}
	data, err := json.Marshal(e)
	if err == nil && e.Answer != nil && int64(len(data)+entryOverhead) > x.nc.MaxPayload() {
		// Too large for one message: the entry goes without its answer,
		// and a retry elsewhere is refused committed_in_region.
		e.Answer = nil
		data, err = json.Marshal(e)
	}
	if err != nil {
		x.published.WithLabelValues("error").Inc()
		return
	}
	select {
	case <-x.stop:
		x.published.WithLabelValues("dropped").Inc() // closed: nobody would send it
		return
	default:
	}
	if x.queued.Add(int64(len(data))) > maxQueuedBytes {
		x.queued.Add(-int64(len(data)))
		x.published.WithLabelValues("dropped").Inc()
		return
	}
	select {
	case x.pending <- pending{key: key, entry: data}:
	default:
		x.queued.Add(-int64(len(data)))
		x.published.WithLabelValues("dropped").Inc()
	}
}

// publish sends the queued entries to the region's stream, one at a time,
// each awaiting its acknowledgement (in the region) within publishTimeout.
func (x *Index) publish() {
	for {
		select {
		case <-x.stop:
			x.drain()
			return
		case p := <-x.pending:
			x.send(x.halt, p)
		}
	}
}

// drain publishes the entries still queued at Close, within its context.
func (x *Index) drain() {
	for {
		select {
		case p := <-x.pending:
			if x.draining.Err() != nil {
				x.queued.Add(-int64(len(p.entry)))
				x.published.WithLabelValues("dropped").Inc()
				continue
			}
			x.send(x.draining, p)
		default:
			return
		}
	}
}

// send publishes one entry within publishTimeout (and ctx), counted.
func (x *Index) send(ctx context.Context, p pending) {
	x.queued.Add(-int64(len(p.entry)))
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	if _, err := x.js.Publish(ctx, x.wire.ActionSubject(p.key), p.entry); err != nil {
		x.published.WithLabelValues("error").Inc()
		x.opts.Logger.Debug("cross-region index entry not published", "err", err)
		return
	}
	x.published.WithLabelValues("ok").Inc()
}

// heartbeat says the region is alive every Heartbeat, into its own
// stream (a plain publish: a lost one only ages the region by a beat).
func (x *Index) heartbeat() {
	t := time.NewTicker(x.opts.Heartbeat)
	defer t.Stop()
	for {
		_ = x.nc.Publish(x.wire.ActionHeartbeatSubject(), []byte(strconv.FormatInt(x.opts.Now().UnixMilli(), 10)))
		select {
		case <-x.stop:
			return
		case <-t.C:
		}
	}
}

// Committed implements replay.Elsewhere: the last entry of key any other
// region published, as this region's copy holds it (one direct get, and a
// second for the region's last heartbeat when its answer is not here).
func (x *Index) Committed(ctx context.Context, key string) (*replay.Commit, error) {
	if !replayKey.MatchString(key) {
		return nil, ErrBadKey
	}
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	m, err := x.last(ctx, schemas.AnyRegionActionSubject(key))
	if err == nil && m == nil {
		x.lookups.WithLabelValues("none").Inc()
		return nil, nil
	}
	var e entry
	if err == nil {
		if err = json.Unmarshal(m.Data, &e); err != nil {
			err = fmt.Errorf("actions: entry of %s: %w", m.Subject, err)
		} else if e.Region == "" || m.Subject != schemas.RegionWire(e.Region).ActionSubject(key) {
			err = fmt.Errorf("actions: entry on %s names region %q", m.Subject, e.Region)
		}
	}
	if err != nil {
		x.lookups.WithLabelValues("error").Inc()
		x.logLookupError(err)
		return nil, err
	}
	x.lookups.WithLabelValues("found").Inc()
	c := &replay.Commit{Region: e.Region, Fingerprint: e.Fingerprint}
	if a := e.Answer; a != nil {
		c.Answer = &replay.Answer{Fingerprint: e.Fingerprint, Status: a.Status, Header: a.Header, Body: a.Body, NotKept: a.NotKept}
		return c, nil
	}
	heard := m.Time
	beat, err := x.last(ctx, schemas.RegionWire(e.Region).ActionHeartbeatSubject())
	if err != nil {
		x.logLookupError(err)
		return c, nil // heard of by its entry at least: refused, not run again
	}
	if beat != nil && beat.Time.After(heard) {
		heard = beat.Time
	}
	c.Unheard = x.opts.Now().Sub(heard) > x.opts.RerunAfter
	return c, nil
}

// LastHeard is when the last heartbeat (or entry) of region arrived here:
// zero when none did.
func (x *Index) LastHeard(ctx context.Context, region string) (time.Time, error) {
	m, err := x.last(ctx, schemas.RegionWire(region).ActionHeartbeatSubject())
	if err != nil || m == nil {
		return time.Time{}, err
	}
	return m.Time, nil
}

// RunAgain implements replay.Elsewhere.
func (x *Index) RunAgain(region string) { x.reruns.WithLabelValues(region).Inc() }

// message is a stored message as a direct get returns it.
type message struct {
	Subject string
	Time    time.Time
	Data    []byte
}

// last is the last message of the region's copy on subject (a wildcard
// allowed), by a direct get, which the copy's own servers answer; nil
// when there is none.
func (x *Index) last(ctx context.Context, subject string) (*message, error) {
	req, err := json.Marshal(struct {
		LastFor string `json:"last_by_subj"`
	}{subject})
	if err != nil {
		return nil, fmt.Errorf("actions: %w", err)
	}
	r, err := x.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+x.seen, req)
	if err != nil {
		return nil, fmt.Errorf("actions: read %s: %w", x.seen, err)
	}
	if status := r.Header.Get("Status"); status == "404" {
		return nil, nil
	} else if status != "" {
		return nil, fmt.Errorf("actions: read %s: status %s %s", x.seen, status, r.Header.Get("Description"))
	}
	t, err := time.Parse(time.RFC3339Nano, r.Header.Get(jetstream.TimeStampHeaer))
	if err != nil {
		return nil, fmt.Errorf("actions: read %s: %w", x.seen, err)
	}
	return &message{Subject: r.Header.Get(jetstream.SubjectHeader), Time: t, Data: r.Data}, nil
}

// logLookupError logs the first lookup that failed (a lookup that fails
// lets the request run: best-effort, as a replay store that fails).
func (x *Index) logLookupError(err error) {
	if err != nil {
		x.lookupError.Do(func() {
			x.opts.Logger.Warn("cross-region index unreadable: requests run as if no other region committed them", "err", err)
		})
	}
}

// Close stops the heartbeats and the publisher once it has published the
// entries still queued, within ctx (those left are dropped, counted).
func (x *Index) Close(ctx context.Context) {
	x.closeOnce.Do(func() {
		x.draining = ctx
		close(x.stop)
	})
	done := make(chan struct{})
	go func() {
		x.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		x.cancelHalt()
		<-done
	}
	x.cancelHalt()
}

var _ replay.Elsewhere = (*Index)(nil)
