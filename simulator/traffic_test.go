package simulator

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// marker stands for record content an error must never quote.
const marker = "zq9marker"

// smallRecords are the records of a short hedged run, as lines.
func smallRecords(t *testing.T) [][]byte {
	t.Helper()
	data := recordsOf(t, Options{Workload: "gpt4o", Stream: true, Requests: 300, Seed: 2, Strategies: []string{StrategyHedgerow}})
	return bytes.Split(bytes.TrimSpace(data), []byte("\n"))
}

func join(lines ...[]byte) []byte { return append(bytes.Join(lines, []byte("\n")), '\n') }

// onlyEvent keeps the lines of one event.
func onlyEvent(lines [][]byte, event string) [][]byte {
	var out [][]byte
	for _, l := range lines {
		if bytes.Contains(l, []byte(`"event":"`+event+`"`)) {
			out = append(out, l)
		}
	}
	return out
}

// ofGroup returns a group record with its attempt records.
func ofGroup(t *testing.T, lines [][]byte, group []byte) [][]byte {
	t.Helper()
	var g schemas.GroupRecord
	if err := json.Unmarshal(group, &g); err != nil {
		t.Fatal(err)
	}
	out := [][]byte{group}
	for _, l := range onlyEvent(lines, schemas.EventAttemptComplete) {
		if bytes.Contains(l, []byte(`"hedge_group_id":"`+g.HedgeGroupID+`"`)) {
			out = append(out, l)
		}
	}
	return out
}

func TestReadTrafficRejectsBadInputNamingTheLine(t *testing.T) {
	lines := smallRecords(t)
	first := lines[0]
	tests := []struct {
		name string
		data []byte
		want string // in the error, besides the line
	}{
		{"an empty file", nil, "holds no records"},
		{"blank lines only", []byte("\n  \n"), "holds no records"},
		{"a line that is not JSON", join(first, []byte(`{"event": "`+marker)), "f.jsonl:2: malformed JSON"},
		{"a JSON value that is not an object", join(first, []byte(`["`+marker+`"]`)), "f.jsonl:2:"},
		{"a record without an event", join(first, []byte(`{"v":1,"route":"`+marker+`"}`)), `f.jsonl:2: no "event" field`},
		{"an event of neither record", join(first, []byte(`{"v":1,"event":"`+marker+`"}`)), "f.jsonl:2: \"event\" is none of"},
		{"a field of the wrong type", join(first, []byte(`{"v":1,"event":"hedge_attempt_complete","elapsed_ms":"`+marker+`"}`)), `f.jsonl:2: field "elapsed_ms"`},
		{"another major version", join(first, []byte(`{"v":2,"event":"hedge_group_complete","route_class":"`+marker+`"}`)), "f.jsonl:2: unsupported record version"},
		{"a group record without its id", join(first, []byte(`{"v":1,"event":"hedge_group_complete","route_class":"`+marker+`"}`)), "f.jsonl:2: group record without hedge_group_id"},
		{"an attempt record without a role", join(first, []byte(`{"v":1,"event":"hedge_attempt_complete","hedge_group_id":"g1","route":"`+marker+`"}`)), "f.jsonl:2: attempt record g1/0: unknown role"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadTraffic(bytes.NewReader(tt.data), "f.jsonl")
			if !errors.Is(err, ErrInvalidRecords) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrInvalidRecords saying %q", err, tt.want)
			}
			if strings.Contains(err.Error(), marker) {
				t.Fatalf("the error quotes the record: %v", err)
			}
		})
	}
}

func TestSweepRecordsRefusesTrafficItCannotReplay(t *testing.T) {
	lines := smallRecords(t)
	groups := onlyEvent(lines, schemas.EventGroupComplete)
	attempts := onlyEvent(lines, schemas.EventAttemptComplete)
	tests := []struct {
		name  string
		lines [][]byte
		want  string
	}{
		{"group records without attempt records", groups, "no primary attempt records"},
		{"attempt records without group records", attempts, "no group records"},
		{"a single group", ofGroup(t, lines, groups[0]), "too few to measure an arrival rate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := ReadTraffic(bytes.NewReader(join(tt.lines...)), "f.jsonl")
			if err != nil {
				t.Fatalf("ReadTraffic: %v", err)
			}
			_, err = SweepRecords(tr, "f.jsonl", SweepOptions{Quantiles: []float64{0.95}})
			if !errors.Is(err, ErrInvalidRecords) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrInvalidRecords saying %q", err, tt.want)
			}
		})
	}
}

// relabelled returns a group's records (ofGroup) moved to another model
// class, with every attempt's output usage set to output: what an
// embeddings request's records hold (no output tokens, no decode speed).
func relabelled(t *testing.T, lines [][]byte, group []byte, model string, output int64) [][]byte {
	t.Helper()
	var out [][]byte
	for _, l := range ofGroup(t, lines, group) {
		var rec map[string]any
		if err := json.Unmarshal(l, &rec); err != nil {
			t.Fatal(err)
		}
		if rec["event"] == schemas.EventGroupComplete {
			rec["model_class"] = model
		} else {
			rec["usage_output_units"] = output
		}
		b, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// A cohort the replay cannot model — an embeddings request, whose answer
// has no output tokens to measure a decode speed from, or a lone group
// with no arrival rate — is left out and named with its reason; the other
// cohorts are replayed as they would be without it.
func TestSweepRecordsLeavesOutACohortItCannotModelAndReplaysTheRest(t *testing.T) {
	lines := smallRecords(t)
	groups := onlyEvent(lines, schemas.EventGroupComplete)
	// The chat cohort alone, less the groups moved to other cohorts below.
	var chat [][]byte
	for _, g := range groups[3:] {
		chat = append(chat, ofGroup(t, lines, g)...)
	}
	embeddings := append(relabelled(t, lines, groups[0], "text-embedding-3-small", 0),
		relabelled(t, lines, groups[1], "text-embedding-3-small", 0)...)
	lone := relabelled(t, lines, groups[2], "lone-model", 20)
	so := SweepOptions{Quantiles: []float64{0.95}, Seed: 4}
	sweepOf := func(ls [][]byte) *Frontier {
		t.Helper()
		tr, err := ReadTraffic(bytes.NewReader(join(ls...)), "f.jsonl")
		if err != nil {
			t.Fatalf("ReadTraffic: %v", err)
		}
		f, err := SweepRecords(tr, "f.jsonl", so)
		if err != nil {
			t.Fatalf("SweepRecords: %v", err)
		}
		return f
	}
	alone := sweepOf(chat)
	mixed := sweepOf(append(append(slices.Clone(chat), embeddings...), lone...))
	want := []SkippedCohort{
		{Name: "chat/lone-model/stream", Groups: 1, Reason: "1 group, too few to measure an arrival rate"},
		{Name: "chat/text-embedding-3-small/stream", Groups: 2,
			Reason: "no committed answer with output tokens to measure token counts and decode speed from"},
	}
	if !reflect.DeepEqual(mixed.Skipped, want) {
		t.Errorf("skipped %+v, want %+v", mixed.Skipped, want)
	}
	if len(mixed.Cohorts) != 1 || !reflect.DeepEqual(mixed.Cohorts, alone.Cohorts) ||
		!reflect.DeepEqual(mixed.Frontier, alone.Frontier) {
		t.Errorf("with the cohorts left out: %+v %+v; the chat cohort alone: %+v %+v",
			mixed.Cohorts, mixed.Frontier, alone.Cohorts, alone.Frontier)
	}
	var table strings.Builder
	if err := mixed.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, s := range want {
		if line := fmt.Sprintf("cohort %s left out (%d group", s.Name, s.Groups); !strings.Contains(table.String(), line) ||
			!strings.Contains(table.String(), "): "+s.Reason+"\n") {
			t.Errorf("the table does not say %q:\n%s", line, table.String())
		}
	}
}

// Records of any order read the same: a live export interleaves groups.
func TestReadTrafficDoesNotDependOnTheOrderOfRecords(t *testing.T) {
	lines := smallRecords(t)
	reversed := make([][]byte, len(lines))
	for i, l := range lines {
		reversed[len(lines)-1-i] = l
	}
	so := SweepOptions{Quantiles: []float64{0.95}, Seed: 4}
	var got []*Frontier
	for _, ls := range [][][]byte{lines, reversed} {
		tr, err := ReadTraffic(bytes.NewReader(join(ls...)), "f.jsonl")
		if err != nil {
			t.Fatal(err)
		}
		f, err := SweepRecords(tr, "f.jsonl", so)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, f)
	}
	a, b := got[0].Frontier[0], got[1].Frontier[0]
	if a.P99 != b.P99 || a.P999 != b.P999 || a.DuplicateRate != b.DuplicateRate || a.ExtraCostRatio != b.ExtraCostRatio {
		t.Fatalf("in order %+v, reversed %+v", a, b)
	}
}

// A group whose record is missing (an export cut mid-group) is left out and
// counted, not replayed with a guessed cohort.
func TestSweepRecordsCountsGroupsWithoutTheirRecord(t *testing.T) {
	lines := smallRecords(t)
	var kept [][]byte
	dropped := false
	for _, l := range lines {
		if !dropped && bytes.Contains(l, []byte(`"event":"`+schemas.EventGroupComplete+`"`)) {
			dropped = true
			continue
		}
		kept = append(kept, l)
	}
	tr, err := ReadTraffic(bytes.NewReader(join(kept...)), "f.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	f, err := SweepRecords(tr, "f.jsonl", SweepOptions{Quantiles: []float64{0.95}})
	if err != nil {
		t.Fatal(err)
	}
	if f.OrphanGroups != 1 || f.Cohorts[0].Groups != 299 || f.Cohorts[0].Primaries != 299 {
		t.Fatalf("orphans %d, cohorts %+v: want 1 group left out of 300", f.OrphanGroups, f.Cohorts)
	}
}

// A superseded record (docs/architecture.md §9) is read and skipped: the
// superseded group's own records say how it arrived and ran, so the replay
// is the same with the record as without it.
func TestReadTrafficSkipsASupersededRecordAndReplaysTheSame(t *testing.T) {
	lines := smallRecords(t)
	var first schemas.GroupRecord
	if err := json.Unmarshal(onlyEvent(lines, schemas.EventGroupComplete)[0], &first); err != nil {
		t.Fatal(err)
	}
	marked, err := schemas.SupersededRecord{EventTime: first.EventTime, Reporter: schemas.ReporterDispatcher,
		UserActionID: first.UserActionID, HedgeGroupID: first.HedgeGroupID, WinnerAttempt: 1, GateEpoch: 1,
		SupersededBy: "0123456789ab-1"}.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	so := SweepOptions{Quantiles: []float64{0.95}, Seed: 4}
	var got []*Frontier
	for _, ls := range [][][]byte{lines, append(slices.Clone(lines), marked)} {
		tr, err := ReadTraffic(bytes.NewReader(join(ls...)), "f.jsonl")
		if err != nil {
			t.Fatalf("ReadTraffic: %v", err)
		}
		f, err := SweepRecords(tr, "f.jsonl", so)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, f)
	}
	a, b := got[0], got[1]
	if a.Cohorts[0].Groups != b.Cohorts[0].Groups || a.Frontier[0].P99 != b.Frontier[0].P99 ||
		a.Frontier[0].DuplicateRate != b.Frontier[0].DuplicateRate {
		t.Fatalf("without the superseded record %+v %+v, with it %+v %+v", a.Cohorts, a.Frontier[0], b.Cohorts, b.Frontier[0])
	}
	_, err = ReadTraffic(bytes.NewReader(join(lines[0], []byte(`{"v":2,"event":"hedge_group_superseded","hedge_group_id":"`+marker+`"}`))), "f.jsonl")
	if !errors.Is(err, ErrInvalidRecords) || !strings.Contains(err.Error(), "f.jsonl:2: unsupported record version") ||
		strings.Contains(err.Error(), marker) {
		t.Fatalf("a superseded record of another major version: %v; want it refused naming the line", err)
	}
}

// A committed stream that broke and was continued (docs/architecture.md
// §6, "Rescue") is read as one answer: the committed attempt's record
// says winner with the status it broke with and the tokens it was billed,
// each continuation's record (role continuation, winner too) the tokens
// it added after the partial answer it was given, continued_from_units
// that partial's length, its input that partial besides the request. A
// continuation is never the group's primary; the answer's output is the
// finishing continuation's continued_from_units plus its own (the winners'
// outputs summed on records without the field), its input the committed
// attempt's; an answer no winner finished is not measured.
func TestReadTrafficReadsAContinuedStreamAsOneAnswerAndNoPrimary(t *testing.T) {
	lines := smallRecords(t)
	const group = "g1"
	var committed schemas.AttemptRecord
	at := -1
	for i, l := range onlyEvent(lines, schemas.EventAttemptComplete) {
		var r schemas.AttemptRecord
		if err := json.Unmarshal(l, &r); err != nil {
			t.Fatal(err)
		}
		if r.HedgeGroupID == group && r.Role == schemas.RolePrimary {
			committed, at = r, i
		}
	}
	if at < 0 || committed.Outcome != schemas.OutcomeWinner || committed.StatusClass != schemas.StatusOK || committed.FirstByteMs == nil {
		t.Fatalf("group %s's primary %+v: want a streamed winner to break", group, committed)
	}
	in, out := committed.UsageInputUnits, committed.UsageOutputUnits
	whole := &workload.TokenCounts{Input: int(in), Output: int(out)}
	// leg is one winner record of the answer's stream: the committed
	// attempt (attempt 1), then each continuation.
	type leg struct {
		status schemas.StatusClass
		output int64 // billed
		// relayed is what the caller read of it, which the next leg
		// continues from; the billed output when 0.
		relayed int64
	}
	tests := []struct {
		name string
		legs []leg
		// reversed writes the continuations' records before the
		// committed attempt's: a live export interleaves them.
		reversed bool
		// unmarked leaves continued_from_units out, as a record of a
		// stream continued from nothing is.
		unmarked bool
		want     *workload.TokenCounts
	}{
		{"a stream that never broke", []leg{{schemas.StatusOK, out, 0}}, false, false, whole},
		{"a winner that broke and was continued answers the whole answer's tokens",
			[]leg{{schemas.StatusLost, 20, 0}, {schemas.StatusOK, out - 20, 0}}, false, false, whole},
		{"a continuation that broke and was continued in turn",
			[]leg{{schemas.StatusServerError, 20, 0}, {schemas.StatusLost, 14, 0}, {schemas.StatusOK, out - 34, 0}}, false, false, whole},
		{"a stalled streamer spliced away, billed past what it relayed",
			[]leg{{schemas.StatusServerError, 25, 20}, {schemas.StatusOK, out - 20, 0}}, false, false, whole},
		{"a continuation read before the attempt it continued",
			[]leg{{schemas.StatusLost, 20, 0}, {schemas.StatusOK, out - 20, 0}}, true, false, whole},
		{"records without continued_from_units sum the winners' outputs",
			[]leg{{schemas.StatusLost, 20, 0}, {schemas.StatusOK, out - 20, 0}}, false, true, whole},
		{"a stream whose continuation broke too is no answer",
			[]leg{{schemas.StatusLost, 20, 0}, {schemas.StatusTimeout, 30, 0}}, false, false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var legs [][]byte
			partial := int64(0)
			for i, l := range tt.legs {
				r := committed
				r.StatusClass, r.UsageOutputUnits = l.status, l.output
				if l.status != schemas.StatusOK {
					r.ErrorScope = schemas.ScopeTransient
				}
				if i > 0 {
					r.Attempt, r.Role, r.Route = 1+i, schemas.RoleContinuation, "route-continues"
					r.UsageInputUnits = in + partial // its input holds the partial answer it continues
					if !tt.unmarked {
						r.ContinuedFromUnits = partial
					}
				}
				partial += cmp.Or(l.relayed, l.output)
				data, err := r.MarshalJSON()
				if err != nil {
					t.Fatal(err)
				}
				legs = append(legs, data)
			}
			if tt.reversed {
				slices.Reverse(legs)
			}
			var ls [][]byte
			for i, l := range onlyEvent(lines, schemas.EventAttemptComplete) {
				if i == at {
					ls = append(ls, legs...)
					continue
				}
				ls = append(ls, l)
			}
			ls = append(ls, onlyEvent(lines, schemas.EventGroupComplete)...)
			tr, err := ReadTraffic(bytes.NewReader(join(ls...)), "f.jsonl")
			if err != nil {
				t.Fatalf("ReadTraffic: %v", err)
			}
			g := tr.groups[group]
			if g.primary == nil || g.primary.At != time.Duration(*committed.FirstByteMs)*time.Millisecond || g.primary.Error {
				t.Errorf("the group's primary %+v: want it ended at its first byte, %d ms", g.primary, *committed.FirstByteMs)
			}
			if got := g.answer.counts(); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("the answer's tokens %+v, want %+v", got, tt.want)
			}
			_, summary, _, err := tr.cohorts(0)
			if err != nil {
				t.Fatalf("cohorts: %v", err)
			}
			if len(summary) != 1 || summary[0].Primaries != summary[0].Groups {
				t.Errorf("cohorts %+v: want one primary per group, none from a continuation", summary)
			}
		})
	}
}
