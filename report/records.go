// Package report computes `hedgerow report` from the kept records
// (docs/architecture.md §9): per cohort and in total, groups and control
// groups, hedged against control latency quantiles with a bootstrap
// interval of the tail gain, duplicate rate, usage of winners and losers,
// extra cost, late completions, observed cancellations, suppressions and
// guardrail decisions; per region too when the records hold more than one.
// The CLI and the gateway's report endpoint both call
// Compute, so a figure is computed in one place only.
package report

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// ErrInvalidRecord is wrapped by every error about one record's bytes.
var ErrInvalidRecord = errors.New("invalid record")

// ErrNotKept is wrapped by a reader's error when the deployment keeps no
// records (NATS without JetStream, or no records stream,
// docs/architecture.md §9).
var ErrNotKept = errors.New("records are not kept")

// ErrTooMany says a read would hold more records than its reader may (a
// gateway's bound on one report request).
var ErrTooMany = errors.New("more records than one read may hold")

// maxLine bounds one JSONL line; a record is well under a kilobyte.
const maxLine = 1 << 20

// Records is a set of attempt, group and superseded records as kept, each
// with the bytes it was read from so an export writes them unchanged.
type Records struct {
	Groups   []schemas.GroupRecord
	Attempts []schemas.AttemptRecord
	// Superseded marks committed groups a takeover superseded
	// (docs/architecture.md §9).
	Superseded []schemas.SupersededRecord
	// raw holds every record's bytes in the order added; groupAt,
	// attemptAt and supersededAt index it.
	raw          [][]byte
	groupAt      []int
	attemptAt    []int
	supersededAt []int
}

// recordHead tells the two records apart by their "event" field.
type recordHead struct {
	Event string `json:"event"`
}

// Add parses one record (an attempt record, a group record at its commit
// or its end, or the record of a superseded commit) and keeps it. A worker's attempt record is ignored
// (the dispatcher's record of the same attempt is the authoritative one,
// docs/architecture.md §9); ignored reports whether it was.
func (r *Records) Add(data []byte) (ignored bool, err error) {
	var head recordHead
	if err := json.Unmarshal(data, &head); err != nil {
		return false, fmt.Errorf("%w: not a JSON object", ErrInvalidRecord)
	}
	raw := append([]byte(nil), data...)
	switch head.Event {
	case schemas.EventAttemptComplete:
		var rec schemas.AttemptRecord
		if err := schemas.Decode(data, &rec); err != nil {
			return false, fmt.Errorf("%w: attempt record: %w", ErrInvalidRecord, err)
		}
		if rec.Reporter == schemas.ReporterWorker {
			return true, nil
		}
		r.attemptAt = append(r.attemptAt, len(r.raw))
		r.Attempts = append(r.Attempts, rec)
	case schemas.EventGroupComplete, schemas.EventGroupCommitted:
		var rec schemas.GroupRecord
		if err := schemas.Decode(data, &rec); err != nil {
			return false, fmt.Errorf("%w: group record: %w", ErrInvalidRecord, err)
		}
		r.groupAt = append(r.groupAt, len(r.raw))
		r.Groups = append(r.Groups, rec)
	case schemas.EventGroupSuperseded:
		var rec schemas.SupersededRecord
		if err := schemas.Decode(data, &rec); err != nil {
			return false, fmt.Errorf("%w: superseded record: %w", ErrInvalidRecord, err)
		}
		r.supersededAt = append(r.supersededAt, len(r.raw))
		r.Superseded = append(r.Superseded, rec)
	default:
		return false, fmt.Errorf("%w: event is none of %s, %s, %s, %s", ErrInvalidRecord,
			schemas.EventAttemptComplete, schemas.EventGroupComplete, schemas.EventGroupCommitted, schemas.EventGroupSuperseded)
	}
	r.raw = append(r.raw, raw)
	return false, nil
}

// Len is how many records are kept.
func (r *Records) Len() int { return len(r.raw) }

// Since keeps the groups whose record is from t on (their event_time), and
// the attempts and superseded records of those groups. A zero t keeps
// everything.
func (r *Records) Since(t time.Time) *Records {
	if t.IsZero() {
		return r
	}
	out := &Records{}
	keep, known := map[string]bool{}, make(map[string]bool, len(r.Groups))
	for _, g := range r.Groups {
		known[g.HedgeGroupID] = true
	}
	for i, g := range r.Groups {
		if !g.EventTime.Before(t) {
			keep[g.HedgeGroupID] = true
			out.groupAt = append(out.groupAt, len(out.raw))
			out.raw = append(out.raw, r.raw[r.groupAt[i]])
			out.Groups = append(out.Groups, g)
		}
	}
	for i, a := range r.Attempts {
		// An attempt whose group record is missing is judged by its own time.
		if keep[a.HedgeGroupID] || !known[a.HedgeGroupID] && !a.EventTime.Before(t) {
			out.attemptAt = append(out.attemptAt, len(out.raw))
			out.raw = append(out.raw, r.raw[r.attemptAt[i]])
			out.Attempts = append(out.Attempts, a)
		}
	}
	for i, sr := range r.Superseded {
		// Judged like an attempt: by its group, else by its own time.
		if keep[sr.HedgeGroupID] || !known[sr.HedgeGroupID] && !sr.EventTime.Before(t) {
			out.supersededAt = append(out.supersededAt, len(out.raw))
			out.raw = append(out.raw, r.raw[r.supersededAt[i]])
			out.Superseded = append(out.Superseded, sr)
		}
	}
	return out
}

// ReadJSONL reads records, one per line (blank lines ignored), as
// WriteJSONL and `hedgerow simulate --records` write and read them. Errors
// name the line, never its content.
func ReadJSONL(rd io.Reader, name string) (*Records, error) {
	r := &Records{}
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	line := 0
	for sc.Scan() {
		line++
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		if _, err := r.Add(sc.Bytes()); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, line, err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return r, nil
}

// WriteJSONL writes every record as it was read, one per line.
func (r *Records) WriteJSONL(w io.Writer) error {
	bw := bufio.NewWriter(w)
	for _, data := range r.raw {
		if _, err := bw.Write(data); err != nil {
			return fmt.Errorf("write records: %w", err)
		}
		if err := bw.WriteByte('\n'); err != nil {
			return fmt.Errorf("write records: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write records: %w", err)
	}
	return nil
}
