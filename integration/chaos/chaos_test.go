//go:build chaos

package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/internal/adapters/records"
	"github.com/hedgerow/hedgerow/internal/natsauth"
	"github.com/hedgerow/hedgerow/internal/tools/cluster"
	"github.com/hedgerow/hedgerow/internal/tools/faultproxy"
	"github.com/hedgerow/hedgerow/schemas"
)

var (
	dirFlag   = flag.String("chaos.dir", "../../bin/cluster", "state directory of the running cluster (make cluster)")
	rateFlag  = flag.Float64("chaos.rate", 25, "requests a second, half streaming, over both gateways")
	phaseFlag = flag.Duration("chaos.phase", 20*time.Second, "load time of each fault's phase")
	seedFlag  = flag.Int64("chaos.seed", 1, "seed of the request mix")
	natsFlag  = flag.String("chaos.nats-node", "", "NATS node the NATS phase kills (default nats-2); name the records stream's leader to kill a leader")
)

// clientDeadline bounds one logical request with its retries: past it with
// neither an answer nor an error it is a silent loss.
const clientDeadline = cluster.Deadline + 20*time.Second

// outcome is what one logical request (one Idempotency-Key) ended with.
type outcome struct {
	answered bool
	code     string // a failure's stable code, "transport:<what>" for a broken connection
	silent   bool
	tries    int
	replayed bool
	gate     string // the complete answer's X-Hedgerow-Gate
	// cut: some try got its answer's first bytes or none, then lost the
	// connection (the fault), so a commit of that try never reached the
	// caller complete; the report of a double commit says so.
	cut bool
	// trace is each try's gateway and how it ended, for the report of a
	// double commit.
	trace []string
}

// phase is one fault under load.
type phase struct {
	name  string
	fault func(t *testing.T, m *cluster.Manifest, l *load) string // returns what it did
}

type load struct {
	run    string
	client *http.Client
	urls   []string
	seq    atomic.Int64
	// streaming requests whose first bytes arrived and whose end has not,
	// per gateway index.
	midStream [2]atomic.Int64
	mu        sync.Mutex
	keys      map[string]*outcome
	wg        sync.WaitGroup
	// superseded counts committed groups the records mark superseded: a
	// retry took their user action over from a gateway that died with
	// them, and its own commit answered (docs/architecture.md §2).
	superseded int
	doubles    []string
}

func TestChaos(t *testing.T) {
	dir, err := filepath.Abs(*dirFlag)
	if err != nil {
		t.Fatal(err)
	}
	m, err := cluster.ReadManifest(dir)
	if err != nil {
		t.Fatalf("no cluster in %s (make cluster): %v", dir, err)
	}
	if !cluster.IsUp(dir) {
		t.Fatalf("the cluster in %s is not wholly up (hedgerow cluster status --dir %s)", dir, dir)
	}
	hashKey, err := os.ReadFile(filepath.Join(dir, "secrets", "hash-key"))
	if err != nil {
		t.Fatal(err)
	}
	run := fmt.Sprintf("%d", time.Now().UnixNano())
	phases := []phase{
		{"baseline (no fault)", func(*testing.T, *cluster.Manifest, *load) string { return "nothing" }},
		{"kill -9 a worker mid-stream", killWorker},
		{"kill -9 a gateway mid-stream, retry on the other", killGateway},
		{"kill a NATS node, bring it back", killNATS},
		{"restart Redis", restartRedis},
		{"partition gateway-1 from Redis", partitionRedis},
	}
	var tables []string
	start := time.Now()
	for i, ph := range phases {
		l := &load{run: fmt.Sprintf("chaos-%s-%d", run, i), client: &http.Client{Timeout: clientDeadline},
			urls: []string{m.GatewayURL(0), m.GatewayURL(1)}, keys: map[string]*outcome{}}
		did := l.runPhase(t, m, ph)
		if !cluster.IsUp(dir) {
			t.Errorf("%s: the cluster is not wholly up after the phase", ph.name)
		}
		dc, uas, missing := doubleCommits(t, m, hashKey, l)
		tables = append(tables, l.table(ph.name, did, dc, uas, missing))
		fmt.Print(tables[len(tables)-1])
		l.check(t, ph.name, dc, missing)
	}
	fmt.Printf("\n== chaos: %d faults in %s ==\n", len(phases), time.Since(start).Round(time.Second))
	for _, tb := range tables {
		fmt.Print(tb)
	}
}

// runPhase sends load for the phase, injects the fault a quarter in, and
// waits for every request's outcome.
func (l *load) runPhase(t *testing.T, m *cluster.Manifest, ph phase) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), *phaseFlag)
	defer cancel()
	stopLoad := make(chan struct{})
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		tick := time.NewTicker(time.Duration(float64(time.Second) / *rateFlag))
		defer tick.Stop()
		for {
			select {
			case <-stopLoad:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
				n := l.seq.Add(1)
				l.wg.Add(1)
				go l.send(n)
			}
		}
	}()
	select {
	case <-time.After(*phaseFlag / 4):
	case <-ctx.Done():
	}
	did := ph.fault(t, m, l)
	<-ctx.Done()
	close(stopLoad)
	<-loadDone
	l.wg.Wait()
	return did
}

// send runs one logical request: gateway n%2 first, and on a broken
// connection or a retryable failure again on the other gateway with the
// same Idempotency-Key, as a production client does, within clientDeadline.
func (l *load) send(n int64) {
	defer l.wg.Done()
	key := fmt.Sprintf("%s-%d", l.run, n)
	stream := n%2 == 0
	o := &outcome{}
	ctx, cancel := context.WithTimeout(context.Background(), clientDeadline)
	defer cancel()
	gw := int(n/2) % 2
	for try := 0; try < 4; try++ {
		o.tries++
		done, code, retry := l.try(ctx, gw, key, stream, o)
		o.trace = append(o.trace, fmt.Sprintf("gateway-%d:%s", gw+1, map[bool]string{true: "answered", false: code}[done]))
		if done {
			o.answered, o.code = true, ""
			break
		}
		o.code = code
		if ctx.Err() != nil {
			o.silent = code == "" || strings.HasPrefix(code, "transport")
			break
		}
		if !retry {
			break
		}
		gw = 1 - gw
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(100*(try+1)) * time.Millisecond):
		}
	}
	l.mu.Lock()
	l.keys[key] = o
	l.mu.Unlock()
}

// try is one HTTP request. It returns whether the answer is complete,
// else the failure's code and whether a client would retry.
func (l *load) try(ctx context.Context, gw int, key string, stream bool, o *outcome) (bool, string, bool) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"chaos %s"}],"max_tokens":40,"stream":%v}`, cluster.Pool, key, stream)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.urls[gw]+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return false, "client:" + err.Error(), false
	}
	req.Header.Set("Authorization", "Bearer "+cluster.TenantKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(frontdoor.HeaderIdempotencyKey, key)
	resp, err := l.client.Do(req)
	if err != nil {
		o.cut = true
		return false, "transport:" + transportKind(err), true
	}
	defer resp.Body.Close()
	if resp.Header.Get(frontdoor.HeaderIdempotentReplayed) == "true" {
		o.replayed = true
	}
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		code := errorCode(data)
		if code == "" {
			code = fmt.Sprintf("http_%d", resp.StatusCode)
		}
		return false, code, resp.Header.Get("X-Should-Retry") == "true"
	}
	o.gate = resp.Header.Get(frontdoor.HeaderGate)
	if !stream {
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			o.cut = true
			return false, "transport:" + transportKind(err), true
		}
		var v struct {
			Choices []json.RawMessage `json:"choices"`
		}
		if json.Unmarshal(data, &v) != nil || len(v.Choices) == 0 {
			return false, "bad_answer", false
		}
		return true, "", false
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	started := false
	defer func() {
		if started {
			l.midStream[gw].Add(-1)
		}
	}()
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if !started {
			started = true
			l.midStream[gw].Add(1)
		}
		if line == "[DONE]" {
			return true, "", false
		}
		if strings.Contains(line, `"error"`) {
			if code := errorCode([]byte(line)); code != "" {
				// A stream that failed after its commit: retrying is a
				// new try of the user action (the door's lapse or the
				// winner gate decides).
				return false, code, true
			}
		}
	}
	o.cut = true
	if err := sc.Err(); err != nil {
		return false, "transport:" + transportKind(err), true
	}
	return false, "transport:stream_cut", true
}

func errorCode(data []byte) string {
	var e struct {
		Error struct {
			Code *string `json:"code"`
			Type string  `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &e) != nil || e.Error.Code == nil {
		return ""
	}
	return *e.Error.Code
}

func transportKind(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "eof"
	}
	return "other"
}

// waitMidStream waits (bounded) until some stream is mid-way on gateway
// gw (-1: any).
func (l *load) waitMidStream(gw int) bool {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if (gw < 0 && l.midStream[0].Load()+l.midStream[1].Load() > 0) || (gw >= 0 && l.midStream[gw].Load() > 0) {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

func killWorker(t *testing.T, m *cluster.Manifest, l *load) string {
	name := cluster.WorkerName(0)
	mid := l.waitMidStream(-1)
	if err := cluster.Kill(m.Spec.Dir, name); err != nil {
		t.Fatal(err)
	}
	n := l.midStream[0].Load() + l.midStream[1].Load()
	time.Sleep(*phaseFlag / 2)
	if err := cluster.Restart(context.Background(), m.Spec.Dir, name); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("SIGKILL %s with %d streams mid-way (waited: %v); restarted it %s later", name, n, mid, *phaseFlag/2)
}

func killGateway(t *testing.T, m *cluster.Manifest, l *load) string {
	name := cluster.GatewayName(0)
	mid := l.waitMidStream(0)
	n := l.midStream[0].Load()
	if err := cluster.Kill(m.Spec.Dir, name); err != nil {
		t.Fatal(err)
	}
	time.Sleep(*phaseFlag / 2)
	if err := cluster.Restart(context.Background(), m.Spec.Dir, name); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("SIGKILL %s with %d streams mid-way on it (waited: %v); clients retried on gateway-2; restarted it %s later", name, n, mid, *phaseFlag/2)
}

func killNATS(t *testing.T, m *cluster.Manifest, _ *load) string {
	name := cluster.NATSName(1)
	if *natsFlag != "" {
		name = *natsFlag
	}
	if err := cluster.Kill(m.Spec.Dir, name); err != nil {
		t.Fatal(err)
	}
	time.Sleep(*phaseFlag / 3)
	if err := cluster.Restart(context.Background(), m.Spec.Dir, name); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("SIGKILL %s, started again on its store %s later", name, *phaseFlag/3)
}

func restartRedis(t *testing.T, m *cluster.Manifest, _ *load) string {
	p, _ := m.Part(cluster.RedisName)
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for p.Running() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := cluster.Restart(context.Background(), m.Spec.Dir, cluster.RedisName); err != nil {
		t.Fatal(err)
	}
	return "SIGTERM redis (AOF), started again at once"
}

func partitionRedis(t *testing.T, m *cluster.Manifest, _ *load) string {
	ctx := context.Background()
	if err := faultproxy.Control(ctx, m.ProxyControlURL(), true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(*phaseFlag / 3)
	if err := faultproxy.Control(ctx, m.ProxyControlURL(), false); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("gateway-1 cut off from Redis (packets held, no reset) for %s, then healed", *phaseFlag/3)
}

// doubleCommits reads the records stream as the observer (an independent
// reader) and counts, among this phase's user actions, those with more
// than one committed group that no record marks superseded; it also
// returns how many user actions it found, and the answered requests with
// no committed group record.
func doubleCommits(t *testing.T, m *cluster.Manifest, hashKey []byte, l *load) (int, int, int) {
	t.Helper()
	nc, err := m.Connect(natsauth.UserObserver)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ua := map[string]string{} // user action id → key
	key := strings.TrimSpace(string(hashKey))
	l.mu.Lock()
	for k := range l.keys {
		ua[schemas.UserActionID([]byte(key), "local", k)] = k
	}
	l.mu.Unlock()
	var kept keptCommits
	for attempt := 1; ; attempt++ {
		kept, err = readCommitted(ctx, js, ua)
		if err == nil {
			break
		}
		if attempt == 5 {
			t.Fatalf("records stream: %v", err)
		}
		t.Logf("records stream, read %d: %v; reading again", attempt, err)
		time.Sleep(2 * time.Second)
	}
	double := 0
	l.mu.Lock()
	for id, gs := range kept.committed {
		// A commit a takeover superseded is marked so in the records
		// (docs/architecture.md §9): it reached no caller whole. The
		// client's own complete answer checks that: a marked commit it
		// got whole still counts.
		delivered := ""
		if o := l.keys[ua[id]]; o.answered {
			if gv, err := arbiter.ParseGateValue(o.gate); err == nil {
				delivered = gv.Group
			}
		}
		live := 0
		for g := range gs {
			if !kept.superseded[g] || g == delivered {
				live++
			}
		}
		if live < 2 {
			continue
		}
		double++
		var lines []string
		for g := range gs {
			lines = append(lines, fmt.Sprintf("      %s superseded=%v", kept.detail[g], kept.superseded[g]))
		}
		slices.Sort(lines)
		l.doubles = append(l.doubles, fmt.Sprintf("   double commit %s (key %s; client: %s; a try cut: %v):\n%s",
			id, ua[id], strings.Join(l.keys[ua[id]].trace, " → "), l.keys[ua[id]].cut, strings.Join(lines, "\n")))
	}
	l.superseded = 0
	for _, gs := range kept.committed {
		for g := range gs {
			if kept.superseded[g] {
				l.superseded++
			}
		}
	}
	missing := 0
	for id, k := range ua {
		if l.keys[k].answered && len(kept.committed[id]) == 0 {
			missing++
		}
	}
	l.mu.Unlock()
	return double, len(kept.seen), missing
}

var errNoMessages = jetstream.ErrNoMessages

// keptCommits is what readCommitted finds of the user actions it reads.
type keptCommits struct {
	committed  map[string]map[string]bool // user action → committed groups
	detail     map[string]string          // group → what its record says
	superseded map[string]bool            // groups a superseded record or a takeover's group record names
	seen       map[string]bool            // user actions with any record
}

// readCommitted reads every group and superseded record of the records
// stream with an ordered consumer and returns, for the user actions of ua,
// their committed groups, what each committed group's record says, which
// groups the records mark superseded (docs/architecture.md §9), and which
// user actions have any record.
func readCommitted(ctx context.Context, js jetstream.JetStream, ua map[string]string) (keptCommits, error) {
	k := keptCommits{committed: map[string]map[string]bool{}, detail: map[string]string{},
		superseded: map[string]bool{}, seen: map[string]bool{}}
	// Read as every reader reads them: batches split, each subject's
	// latest record (docs/architecture.md §9).
	kept, err := records.Reader{JS: js, Stream: records.DefaultStream}.Kept(ctx, time.Time{})
	if err != nil {
		return keptCommits{}, err
	}
	{
		for _, msg := range kept {
			if !strings.HasPrefix(msg.Subject, schemas.StoredRecordPrefix+"group.") &&
				!strings.HasPrefix(msg.Subject, schemas.StoredRecordPrefix+"superseded.") {
				continue
			}
			// A superseded record carries the fields read here too: its
			// group is the one it marks.
			var r schemas.GroupRecord
			if json.Unmarshal(msg.Data, &r) != nil {
				continue
			}
			if _, ours := ua[r.UserActionID]; !ours {
				continue
			}
			k.seen[r.UserActionID] = true
			switch {
			case r.Event == schemas.EventGroupSuperseded:
				k.superseded[r.HedgeGroupID] = true
				continue
			case r.Supersedes != "":
				k.superseded[r.Supersedes] = true
			}
			if r.Outcome == schemas.GroupCommitted {
				if k.committed[r.UserActionID] == nil {
					k.committed[r.UserActionID] = map[string]bool{}
				}
				k.committed[r.UserActionID][r.HedgeGroupID] = true
				k.detail[r.HedgeGroupID] = fmt.Sprintf("%s event=%s error=%q attempts=%d winner=%d/%s epoch=%d committed_ms=%d stream=%v supersedes=%q",
					r.HedgeGroupID, r.Event, r.ErrorCode, r.Attempts, r.WinnerAttempt, r.WinnerRoute, r.GateEpoch, r.CommittedUnixMs, r.Stream, r.Supersedes)
			}
		}
	}
	return k, nil
}

// table is the phase's report.
func (l *load) table(name, did string, double, uas, missing int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	sent := len(l.keys)
	answered, silent, retried, replayed := 0, 0, 0, 0
	failed := map[string]int{}
	for _, o := range l.keys {
		switch {
		case o.answered:
			answered++
		case o.silent:
			silent++
		default:
			failed[o.code]++
		}
		if o.tries > 1 {
			retried++
		}
		if o.replayed {
			replayed++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n-- %s --\n   fault: %s\n", name, did)
	fmt.Fprintf(&b, "   sent %d  answered %d  failed %d  silent losses %d  availability %.1f%%\n",
		sent, answered, sent-answered-silent, silent, 100*float64(answered)/float64(max(sent, 1)))
	fmt.Fprintf(&b, "   retried on the other gateway %d  answers replayed %d\n", retried, replayed)
	for _, code := range slices.Sorted(maps.Keys(failed)) {
		fmt.Fprintf(&b, "   failed %-34s %d\n", code, failed[code])
	}
	fmt.Fprintf(&b, "   double commits (records, independent reader): %d over %d user actions; commits the records mark superseded by a takeover: %d; answered without a committed record: %d\n",
		double, uas, l.superseded, missing)
	for _, d := range l.doubles {
		b.WriteString(d + "\n")
	}
	return b.String()
}

// check holds the phase to the targets: no double commit, no silent
// loss, every failure a stable code.
func (l *load) check(t *testing.T, name string, double, missing int) {
	t.Helper()
	if double > 0 {
		t.Errorf("%s: %d user actions committed twice", name, double)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, o := range l.keys {
		switch {
		case o.silent:
			t.Errorf("%s: %s silently lost (%d tries, last %q)", name, k, o.tries, o.code)
		case !o.answered && (strings.HasPrefix(o.code, "transport") || strings.HasPrefix(o.code, "http_") || o.code == "bad_answer"):
			t.Errorf("%s: %s failed without a stable error code: %s", name, k, o.code)
		}
	}
	if missing > 0 {
		t.Errorf("%s: %d answered requests have no committed group record", name, missing)
	}
}
