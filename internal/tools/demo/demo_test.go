package demo

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/report"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A small live run: the whole system, both classes, every observer.
func TestSmallRunReportsBothStrategiesAndNoDoubleCommits(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the live system")
	}
	// A slower model than the default (time scale 0.1: a 3 s deadline) so
	// the race detector's slowdown does not turn the run into timeouts.
	o := DefaultOptions()
	o.Requests, o.Warmup, o.Rate, o.TimeScale = 150, 50, 50, 0.1
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var progress atomic.Int64
	o.Progress = func(n int) { progress.Add(int64(n)) } // from the load generator's goroutines
	rep, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := progress.Load(), int64(o.Warmup+2*o.Requests); got != want {
		t.Errorf("progress told of %d requests, want %d", got, want)
	}
	if len(rep.Strategies) != 2 || rep.Strategies[0].Name != simulator.StrategyNone || rep.Strategies[1].Name != simulator.StrategyHedgerow {
		t.Fatalf("strategies %+v, want none then hedgerow", rep.Strategies)
	}
	if rep.DoubleCommits != 0 || rep.BadRecords != 0 {
		t.Errorf("double commits %d, undecodable records %d; want 0 and 0", rep.DoubleCommits, rep.BadRecords)
	}
	none, hedged := rep.Strategies[0], rep.Strategies[1]
	if none.DuplicateRate != 0 || hedged.DuplicateRate <= 0 {
		t.Errorf("duplicate rates: none %v, hedgerow %v; want 0 and > 0", none.DuplicateRate, hedged.DuplicateRate)
	}
	for _, s := range rep.Strategies {
		if s.Groups != o.Requests || !(s.P50 > 0 && s.P50 <= s.P90 && s.P90 <= s.P99 && s.P99 <= s.P999) || s.P999 > 30_000 {
			t.Errorf("%s: %d groups, percentiles %v %v %v %v; want %d ordered within the deadline",
				s.Name, s.Groups, s.P50, s.P90, s.P99, s.P999, o.Requests)
		}
	}
	if len(rep.Runs) != 3 {
		t.Fatalf("runs %+v, want warm-up and two measured runs", rep.Runs)
	}
	for _, c := range rep.Runs {
		// Not every attempt need reach a provider (an accept timeout under
		// the race detector), but most do, and every one is joined.
		if c.GroupsSeen != c.Requests || c.UpstreamRecords < c.Requests/2 || c.Stray != 0 {
			t.Errorf("run %s: %d requests, %d group records, %d upstream records (%d stray); want every group record and the upstream records joined",
				c.Name, c.Requests, c.GroupsSeen, c.UpstreamRecords, c.Stray)
		}
	}
	if hedged.DuplicateRate > 0 && rep.CancelledLosers == 0 && rep.LoserOutputTokens == 0 {
		t.Errorf("hedges launched but no loser was cancelled or billed")
	}
	// The gain from its own primary-only run: 150 requests a run, over
	// the report's floor of 100.
	if g := rep.TailGain; g == nil || !(g.Lower <= g.Ratio && g.Ratio <= g.Upper) || g.HedgedSamples != o.Requests || g.ControlSamples != o.Requests {
		t.Errorf("tail gain %+v (%s): want one over both runs' %d requests inside its interval", g, rep.TailGainWithheld, o.Requests)
	}
	if rep.CancelLatencyP99Ms < 0 || rep.TimeScale != o.TimeScale {
		t.Errorf("cancel latency %v, time scale %v", rep.CancelLatencyP99Ms, rep.TimeScale)
	}
}

func TestReportJSONIsTheSimulateObjectPlusTheLiveFigures(t *testing.T) {
	load := 1.5
	rep := &Report{Report: simulator.Report{Workload: "gpt4o", Strategies: []simulator.StrategyResult{{Name: "none"}, {Name: "hedgerow"}}},
		TimeScale: 0.02, CancelLatencyP99Ms: 3, LoserOutputTokens: 10, Runs: []RunCheck{{Name: "none"}},
		TailGain: &report.Gain{Quantile: "p99", Ratio: 1.2}, HostCPUs: 2, LoadAverage: &load}
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]json.RawMessage
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	want := []string{"workload", "requests", "seed", "stream", "conditions", "strategies",
		"time_scale", "open_early", "cancel_latency_p99_ms", "cancel_latency_p50_ms", "cancel_latency_max_ms", "loser_output_tokens", "double_commits",
		"tail_gain", "duplicate_windows", "host_cpus", "load_average_1m"}
	if len(got) != len(want) {
		t.Errorf("keys %v, want exactly %v", keys(got), want)
	}
	for _, k := range want {
		if _, ok := got[k]; !ok {
			t.Errorf("missing top-level %q in %s", k, data)
		}
	}
}

func keys(m map[string]json.RawMessage) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestConfigScalesTheModelDurationsButNotTheWire(t *testing.T) {
	o := DefaultOptions()
	cfg, err := config.Parse("demo.yaml", []byte(configYAML(o, []string{"http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"}, t.TempDir())),
		config.RoleServe, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Pools[poolName].Routes; len(got) != 3 {
		t.Fatalf("pool routes %v, want three", got)
	}
	primary, hedged := cfg.Policies[classPrimary], cfg.Policies[classHedged]
	defaults := config.Defaults()
	tests := []struct {
		name      string
		got, want any
	}{
		{"primary class does not hedge", primary.Hedge, false},
		{"primary class has one attempt", primary.MaxAttempts, 1},
		{"hedged class hedges", hedged.Hedge, true},
		{"hedged class keeps the default attempts", hedged.MaxAttempts, defaults.MaxAttempts},
		{"deadline is 30 s of model time", hedged.Deadline, 600 * time.Millisecond},
		{"primary deadline too", primary.Deadline, 600 * time.Millisecond},
		{"min useful time is 500 ms of model time", hedged.MinUsefulTime, 10 * time.Millisecond},
		{"delay min is 100 ms of model time", hedged.Delay.Min, 2 * time.Millisecond},
		{"delay initial is 1 s of model time", hedged.Delay.Initial, 20 * time.Millisecond},
		{"delay max is 10 s of model time", hedged.Delay.Max, 200 * time.Millisecond},
		{"the estimator window counts samples, not model time", hedged.Delay.Window, defaults.Delay.Window},
		{"accept timeout is a wire latency, within half the scaled deadline", hedged.AcceptTimeout, min(defaults.AcceptTimeout, 300*time.Millisecond)},
		{"NATS listens on loopback for the subscriber", cfg.NATS.Listen, "127.0.0.1:0"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, tt.got, tt.want)
		}
	}
}

func TestOptionsAreValidated(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Options)
		want   string
	}{
		{"no requests", func(o *Options) { o.Requests = 0 }, "requests"},
		{"negative warm-up", func(o *Options) { o.Warmup = -1 }, "warm-up"},
		{"zero rate", func(o *Options) { o.Rate = 0 }, "rate"},
		{"time scale above real time", func(o *Options) { o.TimeScale = 2 }, "time scale"},
		{"unknown workload", func(o *Options) { o.Workload = "telepathy" }, "telepathy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := DefaultOptions()
			tt.mutate(&o)
			_, err := Run(context.Background(), o)
			if !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err %v, want ErrInvalidOptions naming %q", err, tt.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestLosersMeasureCommitToDisconnectOnlyForLosersOfACommit(t *testing.T) {
	committed := &schemas.GroupRecord{Outcome: schemas.GroupCommitted, WinnerRoute: "fake-1", CommittedUnixMs: 1000}
	winnerRec := fakellm.Record{Route: 1, End: fakellm.EndCompleted, BilledOutputTokens: 300}
	tests := []struct {
		name    string
		group   *schemas.GroupRecord
		recs    []fakellm.Record
		cancels []float64
		tokens  int64
	}{
		{"a lone winner has no losers", committed, []fakellm.Record{winnerRec}, nil, 0},
		{
			"a cancelled loser counts from the commit", committed,
			[]fakellm.Record{{Route: 0, End: fakellm.EndDisconnected, DisconnectUnixMs: ptr(int64(1004)), BilledOutputTokens: 26}, winnerRec},
			[]float64{4}, 26,
		},
		{
			"a disconnect in the commit's millisecond counts as zero", committed,
			[]fakellm.Record{{Route: 2, End: fakellm.EndDisconnected, DisconnectUnixMs: ptr(int64(999))}, winnerRec},
			[]float64{0}, 0,
		},
		{
			"a disconnect well before the commit was not caused by it", committed,
			[]fakellm.Record{{Route: 2, End: fakellm.EndDisconnected, DisconnectUnixMs: ptr(int64(900)), BilledOutputTokens: 5}, winnerRec},
			nil, 5,
		},
		{
			"a loser that failed on its own is billed but not a cancellation", committed,
			[]fakellm.Record{{Route: 0, End: fakellm.EndCompleted, Status: 500}, winnerRec},
			nil, 0,
		},
		{
			"a failed group has no winner: everything billed is a loser's",
			&schemas.GroupRecord{Outcome: schemas.GroupFailed},
			[]fakellm.Record{{Route: 1, End: fakellm.EndDisconnected, DisconnectUnixMs: ptr(int64(1600)), BilledOutputTokens: 7}},
			nil, 7,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cancels, tokens := losers(tt.group, tt.recs)
			if len(cancels) != len(tt.cancels) || tokens != tt.tokens {
				t.Fatalf("cancels %v, tokens %d; want %v, %d", cancels, tokens, tt.cancels, tt.tokens)
			}
			for i := range cancels {
				if cancels[i] != tt.cancels[i] {
					t.Errorf("cancels %v, want %v", cancels, tt.cancels)
				}
			}
		})
	}
}

func TestDoubleCommitsAreCountedFromTheRecordsAlone(t *testing.T) {
	group := func(ua, id string, outcome schemas.GroupOutcome) *nats.Msg {
		data, _ := json.Marshal(schemas.GroupRecord{UserActionID: ua, HedgeGroupID: id, Outcome: outcome, CommitPoint: schemas.FirstToken})
		return &nats.Msg{Data: data}
	}
	attemptAs := func(id string, n int, role schemas.Role, outcome schemas.Outcome) *nats.Msg {
		data, _ := json.Marshal(schemas.AttemptRecord{HedgeGroupID: id, Attempt: n, Role: role, Outcome: outcome, CommitPoint: schemas.FirstToken})
		return &nats.Msg{Data: data}
	}
	attempt := func(id string, n int, outcome schemas.Outcome) *nats.Msg {
		return attemptAs(id, n, schemas.RolePrimary, outcome)
	}
	tests := []struct {
		name     string
		groups   []*nats.Msg
		attempts []*nats.Msg
		want     int
	}{
		{"one winner per group and action", []*nats.Msg{group("ua1", "g1", schemas.GroupCommitted), group("ua2", "g2", schemas.GroupFailed)},
			[]*nats.Msg{attempt("g1", 1, schemas.OutcomeWinner), attempt("g1", 2, schemas.OutcomeLoserCanceled)}, 0},
		{"a retry after a failure is not a double commit",
			[]*nats.Msg{group("ua1", "g1", schemas.GroupFailed), group("ua1", "g2", schemas.GroupCommitted)}, nil, 0},
		{"two committed groups of one user action",
			[]*nats.Msg{group("ua1", "g1", schemas.GroupCommitted), group("ua1", "g2", schemas.GroupCommitted)}, nil, 1},
		{"two winning attempts of one group", []*nats.Msg{group("ua1", "g1", schemas.GroupCommitted)},
			[]*nats.Msg{attempt("g1", 1, schemas.OutcomeWinner), attempt("g1", 2, schemas.OutcomeWinner)}, 1},
		{"a continuation carrying a broken winner's stream on is no second winner", []*nats.Msg{group("ua1", "g1", schemas.GroupCommitted)},
			[]*nats.Msg{attempt("g1", 1, schemas.OutcomeWinner), attemptAs("g1", 2, schemas.RoleContinuation, schemas.OutcomeWinner)}, 0},
		{"a second winner beside a continuation still counts", []*nats.Msg{group("ua1", "g1", schemas.GroupCommitted)},
			[]*nats.Msg{attempt("g1", 1, schemas.OutcomeWinner), attemptAs("g1", 2, schemas.RoleContinuation, schemas.OutcomeWinner),
				attemptAs("g1", 3, schemas.RoleHedge, schemas.OutcomeWinner)}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &recorder{groups: map[string][]schemas.GroupRecord{}, attempts: map[string][]schemas.AttemptRecord{},
				changed: make(chan struct{}, 1)}
			for _, m := range tt.groups {
				r.onGroup(m)
			}
			for _, m := range tt.attempts {
				r.onAttempt(m)
			}
			if got := r.doubleCommits(); got != tt.want || r.bad != 0 {
				t.Errorf("double commits %d (%d records undecodable), want %d", got, r.bad, tt.want)
			}
		})
	}
}

func TestDemoNATSListenerAdmitsOnlyTheUsersItGenerated(t *testing.T) {
	o := DefaultOptions()
	cl, err := startCluster(o, make([]byte, 32), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = cl.stop(context.Background())
		}
	}()
	if nc, err := nats.Connect(cl.serve.NATSURL(), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("an anonymous client joined the demo's NATS listener")
	}
	rec, err := startRecorder(cl.serve.NATSURL(), cl.observerSeed())
	if err != nil {
		t.Fatalf("the observer could not connect: %v", err)
	}
	rec.close()
	stopped = true
	if err := cl.stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cl.auth); !os.IsNotExist(err) {
		t.Fatalf("the run's secrets are still at %s: %v", cl.auth, err)
	}
}
