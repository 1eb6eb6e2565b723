// Package records keeps hedgerow's sanitized records (docs/architecture.md
// §9) in a JetStream stream: one record per attempt and one per group, and
// one per commit a takeover superseded, the logical subject naming which
// (schemas.StoredGroupSubject, schemas.StoredAttemptSubject,
// schemas.StoredSupersededSubject). Records are published in batches
// (group commit, Publisher), one JetStream message of JSON lines each; a
// reader (Reader.Kept) splits them and keeps the latest record of each
// logical subject, as a stream holding one message per subject did. A
// gateway whose NATS has no JetStream keeps serving; its records are then
// the live core-NATS ones only.
package records

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
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
	// Linger is how long a record handed to Publish may wait for a
	// commit's batch to carry it before it goes out without one; 0 is
	// DefaultLinger.
	Linger time.Duration
}

// DefaultLinger is Options.Linger's default: short beside what reads
// records (report, the simulator), long beside the gap between commits of
// a gateway busy enough for fsyncs to matter.
const DefaultLinger = 20 * time.Millisecond

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

// Publisher publishes records to the stream, in batches (group commit):
// the records handed to Publish and Commit are queued. A commit's record
// goes out at once when no batch is in flight, so an idle gateway adds no
// wait; while one is in flight, records accumulate and go out together
// when its ack returns, at most maxBatchRecords records and the server's
// max payload a message. Records handed to Publish, which nobody waits
// for, ride with the next commit's batch, or go out once they have waited
// Linger: with sync_interval always every batch is an fsync, and a group's
// own records would otherwise cost two or three of them. A batch message is kept on a subject of
// its own (BatchSubject), its message id the publisher's id and the batch's
// sequence, its body the records as JSON lines; the Reader splits it again.
// Its methods never block longer than their bound; failures are counted and
// logged at most once a logInterval. The zero-JetStream case (Open found
// none) publishes nothing.
type Publisher struct {
	js         jetstream.JetStream // nil: no JetStream, records are not kept
	cfg        Options
	log        *slog.Logger
	failures   *prometheus.CounterVec
	commitWait prometheus.Histogram
	batches    prometheus.Histogram
	// id names the publisher's batches (BatchSubject, their message ids).
	id       string
	maxBytes int // a batch's body bound, under the server's max payload

	mu      sync.Mutex
	lastLog time.Time
	// unawaitedUntil: a commit's ack did not come; until then commits are
	// published without waiting, so a stream that is down delays answers
	// once per commitBackoff, not every one.
	unawaitedUntil time.Time

	// The batcher, under bmu: the records waiting for the next batch, the
	// records of the batch in flight, whether one is, its sequence, how
	// many records were queued and how many of them settled (acked or
	// failed), and the Flush callers waiting for theirs to settle.
	bmu      sync.Mutex
	queue    []*queued
	commits  int // the commits' records in queue
	inFlight int
	sending  bool
	// lingering: a timer will start a batch for the records Publish
	// queued, unless a commit's batch carries them first.
	lingering bool
	seq       uint64
	queued    uint64
	settled   uint64
	flushes   []flushWait
	// beforeBatch, when set (tests), runs before batch seq of n records
	// is published.
	beforeBatch func(seq uint64, n int)
}

// flushWait is a Flush waiting until the first n records queued settled.
type flushWait struct {
	n    uint64
	done chan struct{}
}

// queued is one record waiting for its batch; done (a commit's) receives
// its batch's outcome.
type queued struct {
	subject string
	data    []byte
	done    chan error
	// accounted: the record's failure was counted, by its commit's
	// timeout or by its batch's failure, once.
	accounted atomic.Bool
}

// maxBatchRecords bounds the records of one batch message.
const maxBatchRecords = 1024

// batchHeadroom is kept free of a batch's body under the server's max
// payload, for the message's headers.
const batchHeadroom = 4 << 10

// commitBackoff is how long commits are not waited for after one failed.
const commitBackoff = 5 * time.Second

// ErrNotAwaited is Commit's error while commits are not waited for: the
// record was queued like Publish's, after a recent commit failed.
var ErrNotAwaited = errors.New("records: the stream failed a recent commit; this one was queued without waiting")

// logInterval bounds how often publication failures are logged.
const logInterval = 10 * time.Second

// BatchToken is the subject token after the region's stored-record prefix
// that marks a batch message (BatchSubject): no record subject has it
// (schemas.StoredGroupSubject and the like).
const BatchToken = "batch"

// BatchSubject is where the publisher id's batch seq is kept in region.
func BatchSubject(region, id string, seq uint64) string {
	return schemas.RegionWire(region).StoredRecordPrefix() + BatchToken + "." + id + "." + strconv.FormatUint(seq, 10)
}

// Open creates or updates the stream on nc's JetStream. A server without
// JetStream is logged once and yields a Publisher that keeps nothing; any
// other failure is returned.
func Open(ctx context.Context, nc *nats.Conn, cfg Options, reg prometheus.Registerer, log *slog.Logger) (*Publisher, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var idb [8]byte
	_, _ = rand.Read(idb[:])
	p := &Publisher{cfg: cfg, log: log, id: hex.EncodeToString(idb[:]),
		maxBytes: max(int(nc.MaxPayload())-batchHeadroom, 1<<10),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hedgerow_records_publish_failures_total",
			Help: "Records the stream did not acknowledge, by reason (dropped: pending bound reached; error: refused or timed out).",
		}, []string{"reason"}),
		commitWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hedgerow_records_commit_publish_seconds",
			Help:    "Wait for the stream's ack of a committed group's record before its answer is handed over.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14),
		}),
		batches: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hedgerow_records_batch_records",
			Help:    "Records per batch message published to the records stream (group commit, docs/architecture.md §9).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}),
	}
	// Both reasons exist from the start at 0 (docs/architecture.md §9).
	p.failures.WithLabelValues("dropped")
	p.failures.WithLabelValues("error")
	js, err := jetstream.New(nc)
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
		for _, c := range []prometheus.Collector{p.failures, p.commitWait, p.batches} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("records: register metric: %w", err)
			}
		}
	}
	return p, nil
}

// Keeps reports whether records are kept in a stream.
func (p *Publisher) Keeps() bool { return p != nil && p.js != nil }

// Publish queues data for the stream, kept as subject's record, without
// waiting for its ack. data is held until its batch is sent: the caller
// must not change it. Past MaxPending records queued or in flight, it is
// dropped and counted. A record has no message id of its own: its batch's
// id deduplicates a retried batch.
func (p *Publisher) Publish(subject string, data []byte) {
	if !p.Keeps() {
		return
	}
	p.enqueue(subject, data, nil)
}

// Commit queues data like Publish and waits, at most CommitTimeout, for
// the stream's ack of the batch holding it: the record of a decided commit
// is kept before its answer leaves. After a failure, commits are queued
// without waiting for commitBackoff (ErrNotAwaited), so a stream that is
// down does not hold every answer.
func (p *Publisher) Commit(subject string, data []byte) error {
	if !p.Keeps() {
		return nil
	}
	start := time.Now()
	p.mu.Lock()
	unawaited := start.Before(p.unawaitedUntil)
	p.mu.Unlock()
	if unawaited {
		p.Publish(subject, data)
		return ErrNotAwaited
	}
	done := make(chan error, 1)
	q := p.enqueue(subject, data, done)
	if q == nil {
		return <-done
	}
	timer := time.NewTimer(p.cfg.CommitTimeout)
	defer timer.Stop()
	var err error
	select {
	case err = <-done:
	case <-timer.C:
		err = fmt.Errorf("no ack in %v: %w", p.cfg.CommitTimeout, context.DeadlineExceeded)
		if q.accounted.CompareAndSwap(false, true) {
			p.failed("error", q.subject, err)
		}
	}
	p.commitWait.Observe(time.Since(start).Seconds())
	if err != nil {
		p.mu.Lock()
		p.unawaitedUntil = time.Now().Add(commitBackoff)
		p.mu.Unlock()
		return fmt.Errorf("records: %s: %w", q.subject, err)
	}
	return nil
}

// enqueue queues a record (a commit's with done) and starts a batch when
// none is in flight and a commit waits, or the queue fills a batch; a
// record of Publish's alone waits at most the linger. A record refused at once (a Publish past the bound, a
// record that is not one line) is counted; a commit's done then holds why,
// and enqueue returns nil.
func (p *Publisher) enqueue(subject string, data []byte, done chan error) *queued {
	subject = schemas.RegionWire(p.cfg.Region).StoredSubject(subject)
	if bytes.IndexByte(data, '\n') >= 0 {
		// A record is one line of its batch: JSON's own newlines go.
		var buf bytes.Buffer
		if err := json.Compact(&buf, data); err != nil {
			p.failed("error", subject, fmt.Errorf("a record is not one JSON line: %w", err))
			if done != nil {
				done <- err
			}
			return nil
		}
		data = buf.Bytes()
	}
	q := &queued{subject: subject, data: data, done: done}
	p.bmu.Lock()
	if done == nil && len(p.queue)+p.inFlight >= max(p.cfg.MaxPending, 1) {
		p.bmu.Unlock()
		p.failed("dropped", subject, errors.New("records: too many records awaiting the stream's ack"))
		return nil
	}
	p.queue = append(p.queue, q)
	p.queued++
	if done != nil {
		p.commits++
	}
	start := !p.sending && (done != nil || len(p.queue) >= maxBatchRecords)
	linger := !p.sending && !start && !p.lingering
	p.sending = p.sending || start
	p.lingering = p.lingering || linger
	p.bmu.Unlock()
	switch {
	case start:
		go p.send()
	case linger:
		time.AfterFunc(p.linger(), p.lingered)
	}
	return q
}

func (p *Publisher) linger() time.Duration {
	if p.cfg.Linger > 0 {
		return p.cfg.Linger
	}
	return DefaultLinger
}

// lingered sends the records Publish queued when no commit's batch took
// them within the linger.
func (p *Publisher) lingered() {
	p.bmu.Lock()
	p.lingering = false
	start := !p.sending && len(p.queue) > 0
	p.sending = p.sending || start
	p.bmu.Unlock()
	if start {
		p.send()
	}
}

// send publishes batches, one in flight at a time: the queue when it
// starts, then more while a commit's record, a Flush or a full batch's
// worth waits. Records Publish queued that are left wait for the linger.
func (p *Publisher) send() {
	var body []byte
	for first := true; ; first = false {
		p.bmu.Lock()
		if !first && p.commits == 0 && len(p.flushes) == 0 && len(p.queue) < maxBatchRecords {
			p.sending = false
			linger := len(p.queue) > 0 && !p.lingering
			p.lingering = p.lingering || linger
			p.bmu.Unlock()
			if linger {
				time.AfterFunc(p.linger(), p.lingered)
			}
			return
		}
		n, size := 0, 0
		for n < len(p.queue) && n < maxBatchRecords {
			l := len(p.queue[n].data) + 1
			if n > 0 && size+l > p.maxBytes {
				break
			}
			size += l
			n++
		}
		if n == 0 {
			p.sending = false
			p.bmu.Unlock()
			return
		}
		batch := make([]*queued, n)
		copy(batch, p.queue)
		for _, q := range batch {
			if q.done != nil {
				p.commits--
			}
		}
		p.queue = append(p.queue[:0], p.queue[n:]...)
		p.inFlight = n
		p.seq++
		seq := p.seq
		p.bmu.Unlock()

		body = body[:0]
		for _, q := range batch {
			body = append(body, q.data...)
			body = append(body, '\n')
		}
		if p.beforeBatch != nil {
			p.beforeBatch(seq, n)
		}
		subject := BatchSubject(p.cfg.Region, p.id, seq)
		ctx, cancel := context.WithTimeout(context.Background(), max(p.cfg.CommitTimeout, time.Second))
		_, err := p.js.Publish(ctx, subject, body, jetstream.WithMsgID(p.id+":"+strconv.FormatUint(seq, 10)))
		cancel()
		p.batches.Observe(float64(n))
		for _, q := range batch {
			if err != nil && q.accounted.CompareAndSwap(false, true) {
				p.failed("error", q.subject, err)
			}
			if q.done != nil {
				q.done <- err
			}
		}
		p.bmu.Lock()
		p.inFlight = 0
		p.settled += uint64(n)
		waiting := p.flushes[:0]
		for _, f := range p.flushes {
			if f.n <= p.settled {
				close(f.done)
			} else {
				waiting = append(waiting, f)
			}
		}
		p.flushes = waiting
		p.bmu.Unlock()
	}
}

// Flush waits, at most until ctx ends, until every record queued before it
// was acknowledged or counted failed.
func (p *Publisher) Flush(ctx context.Context) error {
	if !p.Keeps() {
		return nil
	}
	p.bmu.Lock()
	if p.settled >= p.queued {
		p.bmu.Unlock()
		return nil
	}
	f := flushWait{n: p.queued, done: make(chan struct{})}
	p.flushes = append(p.flushes, f)
	// What lingers goes now.
	start := !p.sending
	p.sending = true
	p.bmu.Unlock()
	if start {
		go p.send()
	}
	select {
	case <-f.done:
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
