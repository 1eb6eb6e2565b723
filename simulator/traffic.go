package simulator

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// ErrInvalidRecords is wrapped by every error about a records file: a
// malformed line, a record that lacks what a replay needs, or traffic too
// thin to replay.
var ErrInvalidRecords = errors.New("invalid records")

// maxRecordLine bounds one line of a records file; a record is well under
// a kilobyte.
const maxRecordLine = 1 << 20

// recordHead is what tells the two records apart: their "event" field,
// which both schemas require as a constant.
type recordHead struct {
	Event string `json:"event"`
}

// recordedGroup is what a replay keeps of one hedge group's records.
type recordedGroup struct {
	cohort  cohortKey
	arrival time.Time // zero until the group record is read
	// deadline is the group's overall deadline.
	deadline time.Duration
	primary  *workload.PrimaryEnd
	answer   answerTokens  // the request's lengths, from its winner's records
	itl      time.Duration // from an attempt that streamed to its end; 0 if none
}

// answerTokens gathers the token counts of a group's answer from the
// records of the attempts that carried its committed stream
// (docs/architecture.md §6, "Rescue"): the winner and, when that stream
// broke after its commit and was continued, each continuation — all of
// them recorded winner. A continuation reports only the tokens it added
// after the partial answer it was given, and its input holds that partial
// answer besides the request. So the answer's output is the finishing
// continuation's continued_from_units plus its own output (exact: a
// stalled streamer spliced away is billed an estimate that may pass what
// it relayed), or, on a record without continued_from_units, the winners'
// outputs summed; its input is the committed attempt's own. Records come
// in any order, so the counts are kept until the group is read whole.
type answerTokens struct {
	complete bool  // a winner's record ended ok: the caller had the whole answer
	summed   int64 // the winners' output units, summed
	// joined is an ok continuation's continued_from_units plus its output:
	// the joined answer's length; 0 without such a record.
	joined int64
	input  int64 // the input units of the winner that is no continuation
	// contInput is a continuation winner's input, used only when the
	// committed attempt's own record is missing.
	contInput int64
}

// add counts a winner's record: the committed attempt, or a continuation
// of its stream.
func (a *answerTokens) add(rec *schemas.AttemptRecord) {
	ok := rec.StatusClass == schemas.StatusOK
	a.summed += rec.UsageOutputUnits
	a.complete = a.complete || ok
	if rec.Role != schemas.RoleContinuation {
		a.input = rec.UsageInputUnits
		return
	}
	a.contInput = max(a.contInput, rec.UsageInputUnits)
	if ok && rec.ContinuedFromUnits > 0 {
		a.joined = rec.ContinuedFromUnits + rec.UsageOutputUnits
	}
}

// counts returns the answer's token counts, or nil when no winner's record
// ended ok (the group failed, or its stream broke and no continuation
// finished it) or the answer had no output.
func (a *answerTokens) counts() *workload.TokenCounts {
	output := a.summed
	if a.joined > 0 {
		output = a.joined
	}
	if !a.complete || output < 1 {
		return nil
	}
	input := a.input
	if input == 0 {
		input = a.contInput
	}
	return &workload.TokenCounts{Input: int(input), Output: int(output)}
}

// cohortKey is a cohort as records name it: operation class, model class,
// stream (records carry no max_tokens bucket).
type cohortKey struct {
	operation, model string
	stream           bool
}

func (k cohortKey) String() string {
	mode := "complete"
	if k.stream {
		mode = "stream"
	}
	return k.operation + "/" + k.model + "/" + mode
}

// Traffic is recorded traffic read back from a records file
// (ReadTraffic): per cohort, how primaries ended, the inter-token latencies
// and token counts of answers, and how fast groups arrived.
type Traffic struct {
	groups map[string]*recordedGroup
	// Lines is how many records were read; Skipped counts worker-reported
	// attempt records (the dispatcher's record of the same attempt is the
	// one read) and superseded records (docs/architecture.md §9: the
	// superseded group arrived and ran as its own records say).
	Lines, Skipped int
}

// ReadTraffic reads a records file: one sanitized record per line
// (docs/architecture.md §9), attempt and group records mixed in any order,
// told apart by their "event" field (hedge_attempt_complete,
// hedge_group_complete or hedge_group_committed; hedge_group_superseded is
// read and skipped); blank lines are ignored. name labels errors, which
// name the line and never quote a record's content.
func ReadTraffic(r io.Reader, name string) (*Traffic, error) {
	t := &Traffic{groups: map[string]*recordedGroup{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxRecordLine)
	line := 0
	for sc.Scan() {
		line++
		data := sc.Bytes()
		if len(strings.TrimSpace(string(data))) == 0 {
			continue
		}
		if err := t.readLine(data); err != nil {
			return nil, fmt.Errorf("%w: %s:%d: %w", ErrInvalidRecords, name, line, err)
		}
		t.Lines++
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%w: %s:%d: line longer than %d bytes", ErrInvalidRecords, name, line+1, maxRecordLine)
		}
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	if t.Lines == 0 {
		return nil, fmt.Errorf("%w: %s holds no records", ErrInvalidRecords, name)
	}
	return t, nil
}

func (t *Traffic) group(id string) *recordedGroup {
	g := t.groups[id]
	if g == nil {
		g = &recordedGroup{}
		t.groups[id] = g
	}
	return g
}

func (t *Traffic) readLine(data []byte) error {
	var head recordHead
	if err := json.Unmarshal(data, &head); err != nil {
		return describeJSONError(err)
	}
	switch head.Event {
	case schemas.EventAttemptComplete:
		var rec schemas.AttemptRecord
		if err := schemas.Decode(data, &rec); err != nil {
			return describeJSONError(err)
		}
		return t.readAttempt(&rec)
	case schemas.EventGroupComplete, schemas.EventGroupCommitted:
		// A group's record at its commit stays in the stream when its
		// dispatcher stopped before the group ended (docs/architecture.md
		// §9): its arrival, commit and cohort are as final; `hedgerow
		// report --export` writes it as kept.
		var rec schemas.GroupRecord
		if err := schemas.Decode(data, &rec); err != nil {
			return describeJSONError(err)
		}
		return t.readGroup(&rec)
	case schemas.EventGroupSuperseded:
		// A takeover superseded a committed group (docs/architecture.md
		// §2): that group still arrived and its primary still ran as its
		// own records say, which is all a replay takes of it.
		var rec schemas.SupersededRecord
		if err := schemas.Decode(data, &rec); err != nil {
			return describeJSONError(err)
		}
		t.Skipped++
		return nil
	case "":
		return errors.New(`no "event" field: not an attempt or group record`)
	}
	return fmt.Errorf(`"event" is none of %s, %s, %s, %s`, schemas.EventAttemptComplete, schemas.EventGroupComplete,
		schemas.EventGroupCommitted, schemas.EventGroupSuperseded)
}

// describeJSONError says what is wrong with a line without quoting it:
// where the syntax breaks, or which field has the wrong type.
func describeJSONError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var ver *schemas.VersionError
	switch {
	case errors.As(err, &ver):
		return fmt.Errorf("unsupported record version: %w", schemas.ErrUnsupportedVersion)
	case errors.As(err, &syn):
		return fmt.Errorf("malformed JSON at byte %d", syn.Offset)
	case errors.As(err, &typ):
		return fmt.Errorf("field %q holds a JSON %s, not the %v it should", typ.Field, typ.Value, typ.Type)
	}
	return errors.New("not a JSON object of a record")
}

func (t *Traffic) readGroup(rec *schemas.GroupRecord) error {
	switch {
	case rec.HedgeGroupID == "":
		return errors.New("group record without hedge_group_id")
	case rec.OperationClass == "" || rec.ModelClass == "":
		return fmt.Errorf("group record %s without operation_class or model_class", rec.HedgeGroupID)
	case rec.EventTime.IsZero():
		return fmt.Errorf("group record %s without event_time", rec.HedgeGroupID)
	case rec.ElapsedMs < 0 || rec.OverallDeadlineMs <= 0:
		return fmt.Errorf("group record %s: elapsed_ms %d, overall_deadline_ms %d (want ≥ 0 and > 0)",
			rec.HedgeGroupID, rec.ElapsedMs, rec.OverallDeadlineMs)
	}
	g := t.group(rec.HedgeGroupID)
	if !g.arrival.IsZero() {
		return fmt.Errorf("second group record for %s", rec.HedgeGroupID)
	}
	g.cohort = cohortKey{operation: rec.OperationClass, model: rec.ModelClass, stream: rec.Stream}
	g.deadline = time.Duration(rec.OverallDeadlineMs) * time.Millisecond
	// The group started elapsed_ms before its commit; a failed group's
	// record has no commit instant, and is published as it ends.
	end := rec.EventTime
	if rec.CommittedUnixMs > 0 {
		end = time.UnixMilli(rec.CommittedUnixMs)
	}
	g.arrival = end.Add(-time.Duration(rec.ElapsedMs) * time.Millisecond)
	return nil
}

func (t *Traffic) readAttempt(rec *schemas.AttemptRecord) error {
	switch {
	case rec.HedgeGroupID == "":
		return errors.New("attempt record without hedge_group_id")
	case rec.ElapsedMs < 0 || (rec.FirstByteMs != nil && *rec.FirstByteMs < 0):
		return fmt.Errorf("attempt record %s/%d: negative elapsed_ms or first_byte_ms", rec.HedgeGroupID, rec.Attempt)
	case rec.UsageInputUnits < 0 || rec.UsageOutputUnits < 0:
		return fmt.Errorf("attempt record %s/%d: negative usage", rec.HedgeGroupID, rec.Attempt)
	}
	switch rec.Role {
	case schemas.RolePrimary, schemas.RoleHedge, schemas.RoleReplacement, schemas.RoleContinuation:
	default:
		return fmt.Errorf("attempt record %s/%d: unknown role", rec.HedgeGroupID, rec.Attempt)
	}
	if rec.Reporter == schemas.ReporterWorker {
		t.Skipped++
		return nil
	}
	g := t.group(rec.HedgeGroupID)
	elapsed := time.Duration(rec.ElapsedMs) * time.Millisecond
	var firstByte time.Duration
	if rec.FirstByteMs != nil {
		firstByte = time.Duration(*rec.FirstByteMs) * time.Millisecond
	}
	answered := rec.Outcome == schemas.OutcomeWinner || rec.Outcome == schemas.OutcomeLoserLate ||
		rec.Outcome == schemas.OutcomeLostElection || rec.Outcome == schemas.OutcomeCompleted
	// Only the primary says how a primary ended: a continuation, which
	// follows a committed stream that broke, is never one.
	if rec.Role == schemas.RolePrimary {
		if g.primary != nil {
			return fmt.Errorf("second primary attempt record for %s", rec.HedgeGroupID)
		}
		g.primary = primaryEnd(rec.Outcome, elapsed, firstByte, answered)
	}
	if rec.Outcome == schemas.OutcomeWinner {
		g.answer.add(rec)
	}
	if answered && rec.StatusClass == schemas.StatusOK && rec.UsageOutputUnits >= 1 {
		if rec.FirstByteMs != nil && elapsed > firstByte && g.itl == 0 {
			g.itl = (elapsed - firstByte) / time.Duration(rec.UsageOutputUnits)
		}
	}
	return nil
}

// primaryEnd reads how a primary ended from its record: a first byte when
// it has one; else an answer (no first byte reported: at its end), an error,
// or — cancelled before anything came — a wait censored at its elapsed time.
func primaryEnd(outcome schemas.Outcome, elapsed, firstByte time.Duration, answered bool) *workload.PrimaryEnd {
	switch {
	case firstByte > 0:
		return &workload.PrimaryEnd{At: firstByte}
	case answered:
		return &workload.PrimaryEnd{At: elapsed}
	case outcome == schemas.OutcomeFailed:
		return &workload.PrimaryEnd{At: elapsed, Error: true}
	}
	return &workload.PrimaryEnd{At: elapsed, Censored: true}
}

// RecordedCohort summarises one cohort of recorded traffic.
type RecordedCohort struct {
	Name      string  `json:"cohort"`
	Groups    int     `json:"groups"`
	Primaries int     `json:"primaries"`
	Censored  int     `json:"censored_primaries"`
	Rate      float64 `json:"arrival_rate_per_s"`
	// HangFraction is the probability the estimate leaves to a primary
	// that never sends a first byte.
	HangFraction float64 `json:"hang_fraction"`
}

// SkippedCohort is a recorded cohort a replay leaves out, and why: one
// whose records cannot give the replay a model (no primary, no committed
// answer with output tokens — an embeddings cohort has none —, or too few
// groups to measure an arrival rate). The other cohorts are replayed.
type SkippedCohort struct {
	Name   string `json:"cohort"`
	Groups int    `json:"groups"`
	Reason string `json:"reason"`
}

// cohorts builds each recorded cohort's empirical workload, in a stable
// order (by name), and names the cohorts it leaves out (SkippedCohort); it
// fails only when no cohort can be replayed. requests, when > 0, replaces
// the recorded group count, shared among the replayed cohorts by their
// share of the groups.
func (t *Traffic) cohorts(requests int) ([]cohortTraffic, []RecordedCohort, []SkippedCohort, error) {
	type gathered struct {
		ends     []workload.PrimaryEnd
		itl      []time.Duration
		tokens   []workload.TokenCounts
		arrivals []time.Time
		deadline time.Duration
		censored int
	}
	by := map[cohortKey]*gathered{}
	for _, g := range t.groups {
		if g.arrival.IsZero() {
			continue // attempt records of a group whose record is missing: Orphans
		}
		c := by[g.cohort]
		if c == nil {
			c = &gathered{}
			by[g.cohort] = c
		}
		c.arrivals = append(c.arrivals, g.arrival)
		c.deadline = max(c.deadline, g.deadline)
		if g.primary != nil {
			c.ends = append(c.ends, *g.primary)
			if g.primary.Censored {
				c.censored++
			}
		}
		if tokens := g.answer.counts(); tokens != nil {
			c.tokens = append(c.tokens, *tokens)
		}
		if g.itl > 0 {
			c.itl = append(c.itl, g.itl)
		}
	}
	if len(by) == 0 {
		return nil, nil, nil, fmt.Errorf("%w: no group records", ErrInvalidRecords)
	}
	keys := make([]cohortKey, 0, len(by))
	for k := range by {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b cohortKey) int { return strings.Compare(a.String(), b.String()) })
	// A cohort the replay cannot model is left out, named with its reason;
	// the rest share the requests.
	var skipped []SkippedCohort
	replayed := keys[:0:0]
	total := 0
	for _, k := range keys {
		c := by[k]
		var reason string
		switch {
		case len(c.ends) == 0:
			reason = "no primary attempt records"
		case len(c.tokens) == 0 || len(c.itl) == 0:
			reason = "no committed answer with output tokens to measure token counts and decode speed from"
		case len(c.arrivals) < 2:
			reason = fmt.Sprintf("%d group, too few to measure an arrival rate", len(c.arrivals))
		}
		if reason == "" {
			// Records arrive in the order groups end; sorting the starts
			// tolerates any order.
			slices.SortFunc(c.arrivals, func(a, b time.Time) int { return a.Compare(b) })
			if span := c.arrivals[len(c.arrivals)-1].Sub(c.arrivals[0]); span <= 0 {
				reason = fmt.Sprintf("%d groups over %v, too few to measure an arrival rate", len(c.arrivals), span)
			}
		}
		if reason != "" {
			skipped = append(skipped, SkippedCohort{Name: k.String(), Groups: len(c.arrivals), Reason: reason})
			continue
		}
		replayed = append(replayed, k)
		total += len(c.arrivals)
	}
	if len(replayed) == 0 {
		reasons := make([]string, len(skipped))
		for i, s := range skipped {
			reasons[i] = "cohort " + s.Name + ": " + s.Reason
		}
		return nil, nil, skipped, fmt.Errorf("%w: no cohort can be replayed (%s)", ErrInvalidRecords, strings.Join(reasons, "; "))
	}
	var out []cohortTraffic
	var summary []RecordedCohort
	for _, k := range replayed {
		c := by[k]
		span := c.arrivals[len(c.arrivals)-1].Sub(c.arrivals[0])
		rate := float64(len(c.arrivals)-1) / span.Seconds()
		ends, err := workload.EndDistribution(c.ends)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("%w: cohort %s: %w", ErrInvalidRecords, k, err)
		}
		// Groups are gathered in map order: sorting makes the draws a
		// function of the records alone.
		slices.Sort(c.itl)
		slices.SortFunc(c.tokens, func(a, b workload.TokenCounts) int {
			if a.Input != b.Input {
				return a.Input - b.Input
			}
			return a.Output - b.Output
		})
		model, err := workload.EmpiricalModel(k.String(), &workload.Empirical{Ends: ends, ITL: c.itl, Tokens: c.tokens})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("%w: cohort %s: %w", ErrInvalidRecords, k, err)
		}
		n := len(c.arrivals)
		if requests > 0 {
			n = max(1, int(math.Round(float64(requests)*float64(len(c.arrivals))/float64(total))))
		}
		cond := workload.PinnedConditions()
		cond.Deadline, cond.ArrivalRate = c.deadline, rate
		out = append(out, cohortTraffic{Operation: k.operation, ModelClass: k.model, Model: model, Stream: k.stream, Requests: n, Cond: cond})
		hang := 1.0
		for _, a := range ends {
			hang -= a.P
		}
		summary = append(summary, RecordedCohort{Name: k.String(), Groups: len(c.arrivals), Primaries: len(c.ends),
			Censored: c.censored, Rate: rate, HangFraction: roundOff(hang)})
	}
	return out, summary, skipped, nil
}

// roundOff clears the rounding residue of a probability computed as one
// minus a sum.
func roundOff(p float64) float64 {
	if p < 1e-12 {
		return 0
	}
	return p
}

// Orphans returns how many groups have attempt records but no group
// record (an export cut mid-group): the replay leaves them out.
func (t *Traffic) Orphans() int {
	return len(t.groups) - t.Groups()
}

// Groups returns how many groups have a group record.
func (t *Traffic) Groups() int {
	n := 0
	for _, g := range t.groups {
		if !g.arrival.IsZero() {
			n++
		}
	}
	return n
}
