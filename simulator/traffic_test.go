package simulator

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/schemas"
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
