package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/internal/node"
	"github.com/hedgerow/hedgerow/schemas"
)

// clusterDeadline is the policy deadline of the cluster test's groups, and
// deadlineSlack how late after it a failed Submit may still return on a
// loaded two-core machine running the race detector.
const (
	clusterDeadline = 3 * time.Second
	deadlineSlack   = 2 * time.Second
)

// clusterPolicyYAML, formatted with the deadline, keeps the hedge delay at a known 150ms (the estimator
// stays cold), lets a group replace lost attempts twice, and loses an
// attempt quickly when its worker or its NATS path goes silent.
const clusterPolicyYAML = `
policies:
  default:
    control_fraction: 0
    max_attempts: 3
    delay: {initial: 150ms, min: 10ms, warmup_samples: 1000000}
    deadline: %s
    min_useful_time: 100ms
    accept_timeout: 250ms
    heartbeat_interval: 50ms
    heartbeat_timeout: 300ms
    duplicate_rate: {ceiling: 1}
    guardrail: {enabled: false}
`

// TestGroupsFinishOrFailStablyWhenANATSNodeGoesDown runs a gateway against a
// three-node NATS cluster: the dispatcher and worker process 1 are connected
// to node 1, worker process 2 to node 2, and an independent record
// subscriber to node 0. Every client has the full URL list. Groups run
// continuously from several callers; with attempts in flight (the provider
// holds every new request), one node is shut down, then the held requests are
// released. It asserts:
//   - groups were in flight when the node went down;
//   - every Submit returns, by its deadline plus slack, either a committed
//     answer that is exactly the winning route's content, or a
//     *dispatcher.GroupError with a group id and an error code — nothing else;
//   - the subscriber sees exactly one group record for every submitted group
//     and none for any other, committed with the returned winner or failed
//     with the returned code;
//   - the clients of the lost node reconnect to a survivor, and groups started
//     after the loss commit.
func TestGroupsFinishOrFailStablyWhenANATSNodeGoesDown(t *testing.T) {
	tests := []struct {
		name   string
		killed int // the node shut down mid-run
	}{
		{"the node of the dispatcher and a worker", 1},
		{"the node of a worker only", 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nodes := startCluster(t, 3)
			urls := make([]string, len(nodes))
			for i, ns := range nodes {
				urls[i] = ns.ClientURL()
			}
			p := newProvider(t, 20*time.Millisecond)
			cfg := clusterConfig(t, p)

			records := subscribeGroupRecords(t, connectHome(t, urls, 0, "records"))
			dispatcherConn := connectHome(t, urls, 1, "dispatcher")
			workerConns := []*nats.Conn{connectHome(t, urls, 1, "worker-1"), connectHome(t, urls, 2, "worker-2")}
			for _, nc := range workerConns {
				startWorkers(t, cfg, nc)
			}
			d := startDispatcher(t, cfg, dispatcherConn)
			// Every node must know where the workers and the record
			// subscriber are before the first attempt: two worker
			// processes per route, one subscriber.
			for _, r := range cfg.Routes {
				waitInterest(t, nodes, schemas.AttemptSubject(r.Name), 2)
			}
			waitInterest(t, nodes, schemas.GroupRecordSubject, 1)

			calls := runCallers(t, d, 4)
			calls.waitCommitted(t, 20, time.Time{}, "before the node goes down")

			// Hold every new provider request so attempts are in flight on
			// both workers, let the groups that already returned have their
			// records delivered (a record still inside the node being shut
			// down could be lost: records are at-most-once core NATS), then
			// take the node down.
			release := p.hold(-1)
			t.Cleanup(release)
			for range 2 {
				select {
				case <-p.held:
				case <-time.After(10 * time.Second):
					t.Fatal("no attempt reached the provider while it held requests")
				}
			}
			// The groups that return from here on publish their records
			// after their callers' answers, possibly into the node going
			// down.
			settled := time.Now()
			records.waitFor(t, calls.groupIDs(), nil)
			down := time.Now()
			nodes[tc.killed].Shutdown()
			nodes[tc.killed].WaitForShutdown()
			release()

			calls.waitCommitted(t, 20, down, "after the node went down")
			lost := nodes[tc.killed].Name()
			eventually.True(t, 10*time.Second, "every client reconnected to a surviving node", func() bool {
				for _, nc := range append([]*nats.Conn{dispatcherConn}, workerConns...) {
					if !nc.IsConnected() || nc.ConnectedServerName() == lost {
						return false
					}
				}
				return true
			})
			results := calls.stop(t)

			inFlight := 0
			ids := make([]string, 0, len(results))
			// Records are core NATS messages here (this test keeps no
			// records stream): one published by a group in flight while its
			// node went down, or by one that returned just before (records go
			// out after the answer), may be lost with the node.
			mayLose := map[string]bool{}
			counts := map[string]int{}
			for _, r := range results {
				if r.start.Before(down) && r.end.After(down) {
					inFlight++
				}
				if r.start.Before(down) && r.end.After(settled) {
					if r.err == nil {
						mayLose[r.resp.GroupID] = true
					}
					var ge *dispatcher.GroupError
					if errors.As(r.err, &ge) {
						mayLose[ge.Group] = true
					}
				}
				if took := r.end.Sub(r.start); took > clusterDeadline+deadlineSlack {
					t.Errorf("a Submit returned after %v, past its %v deadline", took, clusterDeadline)
				}
				var ge *dispatcher.GroupError
				switch {
				case r.err == nil:
					counts["committed"]++
					if r.resp.Attempts > 1 {
						counts["committed after more than one attempt"]++
					}
					ids = append(ids, r.resp.GroupID)
					if want := answerFrom(r.resp.WinnerRoute); r.content != want {
						t.Errorf("group %s answered %q, want the winner's %q", r.resp.GroupID, r.content, want)
					}
				case errors.As(r.err, &ge) && ge.Code != "" && ge.Group != "":
					counts[string(ge.Code)]++
					ids = append(ids, ge.Group)
				default:
					t.Errorf("Submit = %v, want an answer or a *dispatcher.GroupError with a code", r.err)
				}
			}
			t.Logf("%d groups (%d in flight when node %s went down): %v", len(results), inFlight, lost, counts)
			if inFlight == 0 {
				t.Fatal("no group was in flight when the node went down: the test exercised nothing")
			}

			got := records.waitFor(t, ids, mayLose)
			for _, r := range results {
				var ge *dispatcher.GroupError
				switch {
				case r.err == nil:
					rec, ok := got[r.resp.GroupID]
					if !ok {
						continue // lost with the node (see mayLose)
					}
					if rec.Outcome != schemas.GroupCommitted || rec.WinnerAttempt != r.resp.Winner {
						t.Errorf("group %s answered by attempt %d, but its record says %s, winner %d",
							r.resp.GroupID, r.resp.Winner, rec.Outcome, rec.WinnerAttempt)
					}
				case errors.As(r.err, &ge):
					if rec, ok := got[ge.Group]; ok && (rec.Outcome != schemas.GroupFailed || rec.ErrorCode != ge.Code) {
						t.Errorf("group %s failed with %s, but its record says %s %s", ge.Group, ge.Code, rec.Outcome, rec.ErrorCode)
					}
				}
			}
			if extra := records.others(ids); len(extra) > 0 {
				t.Errorf("group records of groups no caller submitted, or more than one record of a group: %v", extra)
			}
		})
	}
}

// startCluster starts n NATS servers in this process, clustered over
// loopback routes on ephemeral ports, and returns once each has a route to
// every other.
func startCluster(t *testing.T, n int) []*server.Server {
	t.Helper()
	node := func(i int, routes ...*url.URL) *server.Server {
		return natstest.Start(t, natstest.Name(fmt.Sprintf("node-%d", i)), natstest.MaxPayload(8<<20),
			natstest.Cluster("hedgerow-integration", routes...))
	}
	seed := node(0)
	nodes := []*server.Server{seed}
	for i := 1; i < n; i++ {
		nodes = append(nodes, node(i, natstest.RouteURL(seed)))
	}
	eventually.True(t, 10*time.Second, "every node routed to every other", func() bool {
		for _, ns := range nodes {
			// NumRemotes counts servers; NumRoutes counts pooled connections.
			if ns.NumRemotes() != n-1 {
				return false
			}
		}
		return true
	})
	return nodes
}

// connectHome connects to the cluster with the full URL list, home first.
// It mirrors node.Connect (reconnect forever across the cluster) but keeps
// the list's order, which node.Connect shuffles, so the test knows which
// node each client starts on.
func connectHome(t *testing.T, urls []string, home int, name string) *nats.Conn {
	t.Helper()
	ordered := []string{urls[home]}
	for i, u := range urls {
		if i != home {
			ordered = append(ordered, u)
		}
	}
	nc, err := nats.Connect(strings.Join(ordered, ","), nats.Name(name), nats.DontRandomize(), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatalf("nats connect %s: %v", name, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// waitInterest waits until every running node sees at least want
// subscriptions (local or through routes) on subject.
func waitInterest(t *testing.T, nodes []*server.Server, subject string, want int) {
	t.Helper()
	eventually.True(t, 10*time.Second, fmt.Sprintf("%d subscriptions on %s at every node", want, subject), func() bool {
		for _, ns := range nodes {
			if ns.Running() && ns.GlobalAccount().Interest(subject) < want {
				return false
			}
		}
		return true
	})
}

// clusterConfig is a configuration with routes a and b, both served by p,
// in pool general.
func clusterConfig(t *testing.T, p *provider) *config.Config {
	t.Helper()
	var y strings.Builder
	y.WriteString("routes:\n")
	for _, r := range []string{"a", "b"} {
		fmt.Fprintf(&y, "  - {name: %s, provider: openai, base_url: %q, model: m, labels: {provider: %s}}\n", r, p.baseURL(r), r)
	}
	y.WriteString("pools:\n  general:\n    routes: [a, b]\n")
	fmt.Fprintf(&y, clusterPolicyYAML, clusterDeadline)
	cfg, err := config.Parse("cluster.yaml", []byte(y.String()), config.RoleServe, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("config: %v\n%s", err, y.String())
	}
	return cfg
}

// startWorkers starts a worker process's workers (every route) on nc.
func startWorkers(t *testing.T, cfg *config.Config, nc *nats.Conn) {
	t.Helper()
	w, err := node.StartWorkers(cfg, nc, node.Options{DrainGrace: time.Second})
	if err != nil {
		t.Fatalf("workers: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := w.Stop(ctx); err != nil {
			t.Errorf("workers stop: %v", err)
		}
	})
}

// startDispatcher starts a gateway's dispatcher on nc with in-memory budgets
// and winner gate, as node.StartGateway assembles it.
func startDispatcher(t *testing.T, cfg *config.Config, nc *nats.Conn) *dispatcher.Dispatcher {
	t.Helper()
	gate, err := arbiter.NewLocalGate(arbiter.LocalGateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dcfg := node.DispatcherOptions(cfg)
	dcfg.Conn, dcfg.Store, dcfg.Gate = nc, budgets.NewMemory(nil), gate
	d, err := dispatcher.New(dcfg)
	if err != nil {
		t.Fatalf("dispatcher: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.Close(ctx); err != nil {
			t.Errorf("dispatcher close: %v", err)
		}
	})
	return d
}

// callResult is what one Submit returned, and when.
type callResult struct {
	start, end time.Time
	resp       *dispatcher.Response
	content    string // the answer: resp.Content, or the streamed deltas
	err        error
}

// callers submit groups in a loop, alternating streaming and non-streaming
// requests, until stopped.
type callers struct {
	stopCalls context.CancelFunc
	wg        sync.WaitGroup

	mu      sync.Mutex
	results []callResult
	changed chan struct{} // signalled after every result
}

// runCallers starts n callers on d; the test's cleanup stops them.
func runCallers(t *testing.T, d *dispatcher.Dispatcher, n int) *callers {
	ctx, cancel := context.WithCancel(context.Background())
	c := &callers{stopCalls: cancel, changed: make(chan struct{}, 1)}
	for i := range n {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			for stream := i%2 == 0; ctx.Err() == nil; stream = !stream {
				c.add(call(d, stream))
			}
		}()
	}
	t.Cleanup(func() { cancel(); c.wg.Wait() })
	return c
}

// callTimeout bounds a Submit: a group ends by itself at its deadline, so
// this context ends only a Submit that failed to, keeping the test bounded.
const callTimeout = clusterDeadline + deadlineSlack + 3*time.Second

// call submits one group.
func call(d *dispatcher.Dispatcher, stream bool) callResult {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	req := schemas.ChatRequest{Messages: []schemas.Message{{Role: "user", Content: json.RawMessage(`"hello"`)}},
		Stream: stream, MaxTokens: 50}
	var streamed strings.Builder
	r := callResult{start: time.Now()}
	r.resp, r.err = d.Submit(ctx, dispatcher.Submission{Pool: "general", Request: req},
		sinkFunc(func(dl dispatcher.Delta) error {
			streamed.WriteString(dl.Content)
			return nil
		}))
	r.end = time.Now()
	if ctx.Err() != nil && r.err != nil {
		r.err = fmt.Errorf("Submit did not return by its deadline; the test ended it after %v: %w", callTimeout, r.err)
	}
	if r.resp != nil {
		r.content = r.resp.Content
		if stream {
			r.content = streamed.String()
		}
	}
	return r
}

type sinkFunc func(dispatcher.Delta) error

func (f sinkFunc) Delta(d dispatcher.Delta) error { return f(d) }

func (c *callers) add(r callResult) {
	c.mu.Lock()
	c.results = append(c.results, r)
	c.mu.Unlock()
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// waitCommitted waits until n groups started at or after since have
// committed.
func (c *callers) waitCommitted(t *testing.T, n int, since time.Time, when string) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		c.mu.Lock()
		got := 0
		for _, r := range c.results {
			if r.err == nil && !r.start.Before(since) {
				got++
			}
		}
		c.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-c.changed:
		case <-timeout:
			t.Fatalf("%d of %d groups committed %s", got, n, when)
		}
	}
}

// groupIDs lists the groups of the calls that returned so far.
func (c *callers) groupIDs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []string
	for _, r := range c.results {
		var ge *dispatcher.GroupError
		switch {
		case r.resp != nil:
			ids = append(ids, r.resp.GroupID)
		case errors.As(r.err, &ge):
			ids = append(ids, ge.Group)
		}
	}
	return ids
}

// stop stops the callers after their current call, which ends by its
// deadline, and returns every result.
func (c *callers) stop(t *testing.T) []callResult {
	t.Helper()
	c.stopCalls()
	done := make(chan struct{})
	go func() { c.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(callTimeout + 5*time.Second):
		t.Fatal("a Submit did not return after its context ended")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]callResult(nil), c.results...)
}

// groupRecordBook collects the group records an independent subscriber sees.
type groupRecordBook struct {
	mu      sync.Mutex
	byGroup map[string][]schemas.GroupRecord
	changed chan struct{}
}

func subscribeGroupRecords(t *testing.T, nc *nats.Conn) *groupRecordBook {
	t.Helper()
	b := &groupRecordBook{byGroup: map[string][]schemas.GroupRecord{}, changed: make(chan struct{}, 1)}
	sub, err := nc.Subscribe(schemas.GroupRecordSubject, func(m *nats.Msg) {
		var r schemas.GroupRecord
		if err := json.Unmarshal(m.Data, &r); err != nil {
			r.HedgeGroupID = "undecodable: " + err.Error()
		}
		b.mu.Lock()
		b.byGroup[r.HedgeGroupID] = append(b.byGroup[r.HedgeGroupID], r)
		b.mu.Unlock()
		select {
		case b.changed <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	// A message handler may still run after Unsubscribe returns; closing
	// the connection (registered earlier, so run later) waits for it.
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return b
}

// waitFor waits until every group of ids has a record and returns the first
// record of each.
// Records of the groups in mayLose may be missing; every other one must come.
func (b *groupRecordBook) waitFor(t *testing.T, ids []string, mayLose map[string]bool) map[string]schemas.GroupRecord {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		b.mu.Lock()
		got := make(map[string]schemas.GroupRecord, len(ids))
		var missing []string
		lost := 0
		for _, id := range ids {
			switch recs := b.byGroup[id]; {
			case len(recs) > 0:
				got[id] = recs[0]
			case mayLose[id]:
				lost++
			default:
				missing = append(missing, id)
			}
		}
		b.mu.Unlock()
		if len(missing) == 0 {
			if lost > 0 {
				t.Logf("%d records of groups in flight at the node's shutdown were lost with it", lost)
			}
			return got
		}
		select {
		case <-b.changed:
		case <-timeout:
			t.Fatalf("no group record of %d of %d groups, e.g. %s", len(missing), len(ids), missing[0])
		}
	}
}

// others lists the groups with a record that are not in ids, and those of
// ids with more than one record.
func (b *groupRecordBook) others(ids []string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	known := make(map[string]bool, len(ids))
	for _, id := range ids {
		known[id] = true
	}
	var out []string
	for id, recs := range b.byGroup {
		if !known[id] || len(recs) > 1 {
			out = append(out, fmt.Sprintf("%s×%d", id, len(recs)))
		}
	}
	return out
}
