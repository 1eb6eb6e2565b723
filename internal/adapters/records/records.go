// Package records keeps hedgerow's sanitized records (docs/architecture.md
// §9) in a JetStream stream: one record per attempt and one per group, and
// one per commit a takeover superseded, the subject naming which
// (schemas.StoredGroupSubject, schemas.StoredAttemptSubject,
// schemas.StoredSupersededSubject), at most one message per subject,
// deduplicated by message id. A gateway whose NATS has no JetStream keeps
// serving; its records are then the live core-NATS ones only.
package records

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/schemas"
)

// SubjectPrefix heads every subject the stream keeps
// (schemas.StoredGroupSubject, schemas.StoredAttemptSubject).
const SubjectPrefix = schemas.StoredRecordPrefix

// DefaultStream names the stream when the configuration names none.
const DefaultStream = "hedgerow_records"

// Options is the stream's shape, as config's records section.
type Options struct {
	Stream string
	// Region is the supercluster region whose records the stream keeps
	// (config's deployment.region): the stream captures the region's
	// subjects only (schemas.Wire.StoredRecordPrefix), and a record the
	// dispatcher names by schemas.StoredGroupSubject and the like is kept
	// under them, so two regions' streams never capture each other's
	// records. Empty: today's subjects.
	Region   string
	MaxAge   time.Duration
	MaxBytes int64
	Replicas int
	// Duplicates is the window message ids are deduplicated over.
	Duplicates time.Duration
	// MaxPending bounds the publications awaiting the stream's ack; past
	// it a record is dropped and counted, never waited for.
	MaxPending int
	// CommitTimeout bounds the wait for a committed group's record before
	// its answer is handed over.
	CommitTimeout time.Duration
}

// StreamConfig is the JetStream stream Options describe.
func (c Options) StreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              c.Stream,
		Description:       "hedgerow records: one per attempt, per group and per superseded commit (docs/architecture.md §9)",
		Subjects:          []string{schemas.RegionWire(c.Region).StoredRecordPrefix() + ">"},
		Retention:         jetstream.LimitsPolicy,
		MaxAge:            c.MaxAge,
		MaxBytes:          c.MaxBytes,
		MaxMsgsPerSubject: 1, // the latest record of an attempt, group or superseded commit replaces an earlier one
		Discard:           jetstream.DiscardOld,
		Storage:           jetstream.FileStorage,
		Replicas:          max(c.Replicas, 1),
		Duplicates:        c.Duplicates,
	}
}

// Publisher publishes records to the stream. Its methods never block longer
// than their bound; failures are counted and logged at most once a
// logInterval. The zero-JetStream case (Open found none) publishes nothing.
type Publisher struct {
	js       jetstream.JetStream // nil: no JetStream, records are not kept
	cfg      Options
	log      *slog.Logger
	failures *prometheus.CounterVec
	commits  prometheus.Histogram

	mu      sync.Mutex
	lastLog time.Time
	// unawaitedUntil: a commit's ack did not come; until then commits are
	// published without waiting, so a stream that is down delays answers
	// once per commitBackoff, not every one.
	unawaitedUntil time.Time
}

// commitBackoff is how long commits are not waited for after one failed.
const commitBackoff = 5 * time.Second

// ErrNotAwaited is Commit's error while commits are not waited for: the
// record was queued like Publish's, after a recent commit failed.
var ErrNotAwaited = errors.New("records: the stream failed a recent commit; this one was queued without waiting")

// logInterval bounds how often publication failures are logged.
const logInterval = 10 * time.Second

// Open creates or updates the stream on nc's JetStream. A server without
// JetStream is logged once and yields a Publisher that keeps nothing; any
// other failure is returned.
func Open(ctx context.Context, nc *nats.Conn, cfg Options, reg prometheus.Registerer, log *slog.Logger) (*Publisher, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Publisher{cfg: cfg, log: log,
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hedgerow_records_publish_failures_total",
			Help: "Records the stream did not acknowledge, by reason (dropped: pending bound reached; error: refused or timed out).",
		}, []string{"reason"}),
		commits: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hedgerow_records_commit_publish_seconds",
			Help:    "Wait for the stream's ack of a committed group's record before its answer is handed over.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14),
		}),
	}
	// Both reasons exist from the start at 0 (docs/architecture.md §9).
	p.failures.WithLabelValues("dropped")
	p.failures.WithLabelValues("error")
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(max(cfg.MaxPending, 1)),
		jetstream.WithPublishAsyncTimeout(max(cfg.CommitTimeout, time.Second)),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
			p.failed("error", m.Subject, err)
		}))
	if err != nil {
		return nil, fmt.Errorf("records: %w", err)
	}
	switch _, err := js.CreateOrUpdateStream(ctx, cfg.StreamConfig()); {
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) ||
		errors.Is(err, nats.ErrNoResponders):
		log.Warn("NATS has no JetStream: records are not kept, only published live (docs/architecture.md §9)", "stream", cfg.Stream)
	case err != nil:
		return nil, fmt.Errorf("records: stream %s: %w", cfg.Stream, err)
	default:
		p.js = js
	}
	// Registered last, so an Open that failed (and is tried again) leaves
	// nothing registered.
	if reg != nil {
		for _, c := range []prometheus.Collector{p.failures, p.commits} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("records: register metric: %w", err)
			}
		}
	}
	return p, nil
}

// Keeps reports whether records are kept in a stream.
func (p *Publisher) Keeps() bool { return p != nil && p.js != nil }

// Publish queues data for the stream under subject and message id, without
// waiting for its ack.
func (p *Publisher) Publish(subject, id string, data []byte) {
	if !p.Keeps() {
		return
	}
	subject = schemas.RegionWire(p.cfg.Region).StoredSubject(subject)
	_, err := p.js.PublishAsync(subject, data, jetstream.WithMsgID(id), jetstream.WithStallWait(time.Millisecond))
	if err != nil {
		p.failed("dropped", subject, err)
	}
	// A failure after the publication went out (a refusal, no ack in
	// time) reaches the async error handler Open installed.
}

// Commit publishes data and waits, at most CommitTimeout, for the stream's
// ack: the record of a decided commit is kept before its answer leaves.
// After a failure, commits are queued without waiting for commitBackoff
// (ErrNotAwaited), so a stream that is down does not hold every answer.
func (p *Publisher) Commit(subject, id string, data []byte) error {
	if !p.Keeps() {
		return nil
	}
	start := time.Now()
	p.mu.Lock()
	unawaited := start.Before(p.unawaitedUntil)
	p.mu.Unlock()
	if unawaited {
		p.Publish(subject, id, data)
		return ErrNotAwaited
	}
	subject = schemas.RegionWire(p.cfg.Region).StoredSubject(subject)
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.CommitTimeout)
	defer cancel()
	_, err := p.js.Publish(ctx, subject, data, jetstream.WithMsgID(id))
	p.commits.Observe(time.Since(start).Seconds())
	if err != nil {
		p.mu.Lock()
		p.unawaitedUntil = time.Now().Add(commitBackoff)
		p.mu.Unlock()
		p.failed("error", subject, err)
		return fmt.Errorf("records: %s: %w", subject, err)
	}
	return nil
}

// Flush waits, at most until ctx ends, for the acks of every queued record.
func (p *Publisher) Flush(ctx context.Context) error {
	if !p.Keeps() {
		return nil
	}
	select {
	case <-p.js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("records: flush: %w", ctx.Err())
	}
}

func (p *Publisher) failed(reason, subject string, err error) {
	p.failures.WithLabelValues(reason).Inc()
	p.mu.Lock()
	now := time.Now()
	quiet := now.Sub(p.lastLog) < logInterval
	if !quiet {
		p.lastLog = now
	}
	p.mu.Unlock()
	if !quiet {
		p.log.Warn("record not kept", "subject", subject, "reason", reason, "err", err)
	}
}
