package records

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hedgerow/hedgerow/report"
	"github.com/hedgerow/hedgerow/schemas"
)

// readBatch is how many records one fetch asks for.
const readBatch = 1000

// Reader reads the kept records back: `hedgerow report --nats` and the
// gateway's report endpoint. It needs the observer role's read API of the
// stream (its info, an ordered consumer of its own, docs/architecture.md §13).
type Reader struct {
	JS     jetstream.JetStream // nil: records are not kept (ErrNotKept)
	Stream string
	// Region is the region whose stream it is (Options.Region): its
	// records are read under the region's subjects. Empty: today's.
	Region string
	// Limit bounds how many records one read may hold in memory; a read
	// that would take more fails with report.ErrTooMany before it reads
	// any. Zero: no bound (the command, on the operator's own machine).
	Limit int
}

// SubjectAndID is where a record is kept and its message id, as the
// dispatcher publishes it (schemas.StoredGroupSubject, StoredAttemptSubject,
// StoredSupersededSubject and their ids), read from the record itself: to keep records again, e.g.
// an export, in another stream. keep is false for a worker's own record,
// which is never kept (docs/architecture.md §9).
func SubjectAndID(data []byte) (subject, id string, keep bool, err error) {
	var head struct {
		Event    string           `json:"event"`
		Reporter schemas.Reporter `json:"reporter"`
		Group    string           `json:"hedge_group_id"`
		Attempt  int              `json:"attempt"`
	}
	if err := json.Unmarshal(data, &head); err != nil || head.Group == "" {
		return "", "", false, fmt.Errorf("%w: no hedge_group_id", report.ErrInvalidRecord)
	}
	switch head.Event {
	case schemas.EventAttemptComplete:
		return schemas.StoredAttemptSubject(head.Group, head.Attempt), schemas.StoredAttemptID(head.Group, head.Attempt),
			head.Reporter != schemas.ReporterWorker, nil
	case schemas.EventGroupComplete, schemas.EventGroupCommitted:
		return schemas.StoredGroupSubject(head.Group), schemas.StoredGroupID(head.Group, head.Event), true, nil
	case schemas.EventGroupSuperseded:
		// Its hedge_group_id is the superseded group: kept beside that
		// group's record, never replacing it (docs/architecture.md §9).
		return schemas.StoredSupersededSubject(head.Group), schemas.StoredSupersededID(head.Group), true, nil
	}
	return "", "", false, fmt.Errorf("%w: not an attempt, group or superseded record", report.ErrInvalidRecord)
}

// Reader reads back the records p keeps (a Reader without JetStream when
// it keeps none).
func (p *Publisher) Reader() Reader {
	if p == nil {
		return Reader{}
	}
	return Reader{JS: p.js, Stream: p.cfg.Stream, Region: p.cfg.Region}
}

// Kept is one record as the stream keeps it: its logical subject (the
// zero Wire's, as the dispatcher names it: schemas.StoredGroupSubject and
// the like) and its bytes.
type Kept struct {
	Subject string
	Data    []byte
}

// Records reads every record kept from since on (the stream's time of the
// message; zero reads all), then keeps the groups whose own event_time is
// from since on and their attempts (report.Records.Since). It reads what
// Kept reads.
func (r Reader) Records(ctx context.Context, since time.Time) (*report.Records, error) {
	kept, err := r.Kept(ctx, since)
	if err != nil {
		return nil, err
	}
	out := &report.Records{}
	for _, k := range kept {
		if _, err := out.Add(k.Data); err != nil {
			return nil, fmt.Errorf("records: %s record on %s: %w", r.stream(), k.Subject, err)
		}
	}
	return out.Since(since), nil
}

func (r Reader) stream() string {
	if r.Stream == "" {
		return DefaultStream
	}
	return r.Stream
}

// Kept reads every record kept from since on (the stream's time of the
// message; zero reads all): a batch message (BatchSubject) split into its
// records, a record's own message (a stream an older gateway wrote) as it
// is. Of the records of one logical subject (SubjectAndID) it keeps the
// latest in stream order, at its place in that order: what a stream keeping
// one message per subject held before batches (a group's
// hedge_group_complete record replacing its hedge_group_committed one). It
// stops at the last message kept when it started, so a busy stream cannot
// keep it reading; it reads with an ordered consumer that is gone when it
// returns. Limit bounds the records it keeps (one a logical subject).
func (r Reader) Kept(ctx context.Context, since time.Time) ([]Kept, error) {
	if r.JS == nil {
		return nil, fmt.Errorf("%w: NATS has no JetStream", report.ErrNotKept)
	}
	stream := r.stream()
	prefix := schemas.RegionWire(r.Region).StoredRecordPrefix()
	batchPrefix := prefix + BatchToken + "."
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{prefix + ">"}}
	if !since.IsZero() {
		// A record is published after its event: starting at since misses none.
		start := since
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &start
	}
	cons, err := r.JS.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
			errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) || errors.Is(err, nats.ErrNoResponders) {
			return nil, fmt.Errorf("%w: stream %s: %w", report.ErrNotKept, stream, err)
		}
		return nil, fmt.Errorf("records: read %s: %w", stream, err)
	}
	info, err := cons.Info(ctx) // created with the consumer; asked again for NumPending
	if err != nil {
		return nil, fmt.Errorf("records: read %s: %w", stream, err)
	}
	// Best effort: the server would drop the idle consumer anyway, but a
	// gateway asked for many reports should not leave one each behind.
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = r.JS.DeleteConsumer(dctx, stream, info.Name)
	}()
	pending := info.NumPending
	if r.Limit > 0 && pending > uint64(r.Limit) {
		return nil, fmt.Errorf("%w: %d records, the limit is %d", report.ErrTooMany, pending, r.Limit)
	}
	var l latest
	for pending > 0 {
		batch, err := cons.Fetch(int(min(pending, readBatch)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("records: read %s: %w", stream, err)
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			pending--
			if err := l.message(msg.Subject(), prefix, batchPrefix, msg.Data()); err != nil {
				meta, _ := msg.Metadata()
				seq := uint64(0)
				if meta != nil {
					seq = meta.Sequence.Stream
				}
				return nil, fmt.Errorf("records: %s message %d: %w", stream, seq, err)
			}
			if r.Limit > 0 && len(l.at) > r.Limit {
				return nil, fmt.Errorf("%w: more than %d records, the limit", report.ErrTooMany, r.Limit)
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, fmt.Errorf("records: read %s: %w", stream, err)
		}
		if got == 0 {
			// Records older than the stream's max_age left while reading.
			break
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("records: read %s: %w", stream, err)
		}
	}
	return l.kept(), nil
}

// latest keeps, of the records read in stream order, the latest of each
// logical subject.
type latest struct {
	all []Kept         // in stream order; a replaced one's Data is nil
	at  map[string]int // logical subject → its latest in all
}

// message adds a message on subject: a batch's records (under
// batchPrefix), or one record kept on its own subject (under prefix).
func (l *latest) message(subject, prefix, batchPrefix string, data []byte) error {
	if !strings.HasPrefix(subject, batchPrefix) {
		rest, _ := strings.CutPrefix(subject, prefix)
		l.add(schemas.StoredRecordPrefix+rest, data)
		return nil
	}
	for line := range bytes.Lines(data) {
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			continue
		}
		logical, _, _, err := SubjectAndID(line)
		if err != nil {
			return fmt.Errorf("batch %s: %w", subject, err)
		}
		l.add(logical, line)
	}
	return nil
}

func (l *latest) add(subject string, data []byte) {
	if l.at == nil {
		l.at = map[string]int{}
	}
	if i, ok := l.at[subject]; ok {
		l.all[i].Data = nil
	}
	l.at[subject] = len(l.all)
	l.all = append(l.all, Kept{Subject: subject, Data: data})
}

func (l *latest) kept() []Kept {
	out := l.all[:0]
	for _, k := range l.all {
		if k.Data != nil {
			out = append(out, k)
		}
	}
	return out
}

// Last is the latest record kept as subject's (the zero Wire's logical
// subject, schemas.StoredGroupSubject and the like), read as Kept reads
// them; found is false when none is kept.
func (r Reader) Last(ctx context.Context, subject string) (data []byte, found bool, err error) {
	kept, err := r.Kept(ctx, time.Time{})
	if err != nil {
		return nil, false, err
	}
	for i := len(kept) - 1; i >= 0; i-- {
		if kept[i].Subject == subject {
			return kept[i].Data, true, nil
		}
	}
	return nil, false, nil
}
